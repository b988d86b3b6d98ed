"""Trainers of different families and tokenizers share experience through real SEE, THL and
MWRA servers (in-process, port 0, real Redis with a private key prefix) for each probe.

Policy A (GPT-2, byte BPE) is warm-started on `add`, policy B (Llama, characters) on `rev`, so
each fails the other's skill: SGT must rescue prompts both ways, XGRPO must pool both groups'
statistics, PRP must pool the other's rollouts through THL alignment. Policy C (Qwen2, Unigram)
joins them on `add` for the three-policy runs, on a pool of two CPU units.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from warm_start import TASK, WARM, start_training, warm_checkpoints

pytestmark = [pytest.mark.slow, pytest.mark.timeout(360)]
torch.set_num_threads(1)

REDIS_URL = "redis://127.0.0.1:6379/0"
ROUNDS = 4


@pytest.fixture(scope="module")
def warm_policies(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return warm_checkpoints(request, tmp_path_factory)


class _Services:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.prefix = f"e2e{uuid.uuid4().hex[:10]}"
        self.run_ids: dict[str, int] = {}
        """Runs that used all three services, with how many policies (THL tokenizers) each."""
        self.see_only_runs: list[str] = []
        """Runs that used SEE only (THL in-process, no MWRA)."""

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)


@pytest.fixture(scope="module")
def services(warm_policies: dict[str, Path]) -> Iterator[_Services]:
    import redis

    from mutualrl.mwra.config import MwraConfig
    from mutualrl.mwra.server import start_mwra
    from mutualrl.see.config import SeeConfig
    from mutualrl.see.server import start_see
    from mutualrl.thl.config import ThlConfig
    from mutualrl.thl.server import start_thl

    s = _Services()
    common = dict(port=0, metrics_port=None, auth_token=None, grace_seconds=0.2,
                  key_prefix=s.prefix)
    see = s.call(start_see(SeeConfig(redis_url=REDIS_URL, rest_port=None, **common)))
    # THL reads tokenizers from the warm starts (pytest's cache) and the runs (tmp) only.
    roots = [tempfile.gettempdir(), *{str(p.parent) for p in warm_policies.values()}]
    thl = s.call(start_thl(ThlConfig(tokenizer_roots=roots, **common)))
    mwra = s.call(start_mwra(MwraConfig(redis_url=REDIS_URL, **common)))
    s.see, s.thl, s.mwra = see.address, thl.address, mwra.address
    r = redis.Redis.from_url(REDIS_URL)
    try:
        yield s
        # DeleteRun on every service removes every key the runs made, and nothing is left.
        from mutualrl.client.runs import delete_run

        for run_id, n_policies in s.run_ids.items():
            deleted = delete_run(run_id, see=s.see, thl=s.thl, mwra=s.mwra)
            assert deleted["see"] > 0 and deleted["mwra"] > 0, deleted
            # THL keeps one tokenizer key per policy of the run.
            assert deleted["thl"] == n_policies, (run_id, deleted)
        for run_id in s.see_only_runs:
            deleted = delete_run(run_id, see=s.see, thl=s.thl, mwra=s.mwra)
            assert deleted["see"] > 0 and deleted["mwra"] == 0 and deleted["thl"] == 0, deleted
        assert list(r.scan_iter(f"{s.prefix}:*")) == []
    finally:
        for server in (see, thl, mwra):
            s.call(server.stop(0.2))
        s.loop.call_soon_threadsafe(s.loop.stop)
        keys = list(r.scan_iter(f"{s.prefix}:*"))
        if keys:
            r.delete(*keys)
        r.close()


def _config(services: _Services, warm: dict[str, Path], probe: dict[str, Any], out: Path,
            run_id: str, names: tuple[str, ...] = ("A", "B"), **extra: Any) -> Any:
    from mutualrl.trainer.config.run import TrainerConfig

    return TrainerConfig.model_validate({
        "run_id": run_id, "output_dir": str(out), "task": TASK,
        "grpo": {"group_size": 4, "prompts_per_round": 8, "rounds": ROUNDS, "lr": 3e-4},
        "probe": {"deadline_seconds": 20.0, **probe},
        "eval": {"every": ROUNDS, "per_skill": 4}, "checkpoint": {"every": 2},
        "metrics": {"tensorboard": True, "progress": False},
        "services": {"see": services.see, "thl": services.thl, "mwra": services.mwra},
        "policies": [{"name": n, "preset": WARM[n][0], "sft_checkpoint": str(warm[n])}
                     for n in names],
        **extra,
    })


def _run_pair(services: _Services, warm: dict[str, Path], probe: dict[str, Any],
              tmp: Path, names: tuple[str, ...] = ("A", "B"), slots: int = 2,
              stagger: float = 0.0,
              **extra: Any) -> tuple[Any, dict[str, list[dict[str, float]]]]:
    """Train `names` together in threads; with `stagger`, each policy's session is built (it
    registers with MWRA) and started that many seconds after the previous one's start."""
    from mutualrl.client.mwra import MwraClient
    from mutualrl.client.see import SeeClient
    from mutualrl.common.channel import ClientOptions
    from mutualrl.trainer.runtime.session import build_session

    run_id = f"e2e-{probe['kind']}-{uuid.uuid4().hex[:6]}"
    services.run_ids[run_id] = len(names)
    mwra = MwraClient(services.mwra)
    mwra.register_local_worker(run_id, "e2e-worker", slots=slots)
    keep = mwra.keepalive(run_id, "e2e-worker", 2.0)
    cfg = _config(services, warm, probe, tmp, run_id, names, **extra)
    errors: list[BaseException] = []

    sessions: list[Any] = []
    threads: list[threading.Thread] = []
    if not stagger:
        sessions = [build_session(cfg, n, cache_dir=tmp / "presets") for n in names]
    for i, n in enumerate(names):
        if stagger:
            if i:
                time.sleep(stagger)
            sessions.append(build_session(cfg, n, cache_dir=tmp / "presets"))
        threads.append(start_training(sessions[i], errors))
    for t in threads:
        t.join(timeout=300)
    for s in sessions:
        s.close()
    keep.stop()
    mwra.close()
    assert not errors, errors
    rows: dict[str, list[dict[str, float]]] = {}
    for n in names:
        d = cfg.run_dir(n)
        rows[n] = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        assert [r["round"] for r in rows[n]] == list(range(ROUNDS))
        assert any((d / "tb").iterdir())
        assert (d / "checkpoints" / f"round-{ROUNDS:06d}" / "policy" / "config.json").exists()
        assert (d / "checkpoints" / f"round-{ROUNDS:06d}" / "resume.pt").exists()
        assert "heldout/mean" in rows[n][-1]
        assert sum(r["fallback"] for r in rows[n]) == 0
    with SeeClient(ClientOptions(address=services.see)) as see:
        stats = see.run_stats(run_id)
    return stats, rows


def _transfers(stats: Any, kind: int) -> dict[tuple[str, str], int]:
    return {(t.taker_policy, t.source_policy): t.count for t in stats.transfers
            if t.kind == kind}


def test_sgt_rescues_both_ways(services: _Services, warm_policies: dict[str, Path],
                               tmp_path: Path) -> None:
    from mutualrl.v1 import experience_pb2 as pb

    stats, rows = _run_pair(services, warm_policies, {"kind": "sgt", "sgt_lambda": 0.5},
                            tmp_path)
    published = {p.policy_id: dict(p.published) for p in stats.policies}
    assert published["A"]["ROLLOUT"] == ROUNDS * 8 * 4 == published["B"]["ROLLOUT"]
    assert published["A"]["VERIFIED_SUCCESS"] > 0 and published["B"]["VERIFIED_SUCCESS"] > 0
    for n in ("A", "B"):
        assert sum(r["rescued_prompts"] for r in rows[n]) > 0, n
        assert any(r.get("loss_sgt", 0.0) > 0 for r in rows[n]), n
    moved = _transfers(stats, pb.VERIFIED_SUCCESS)
    assert moved.get(("A", "B"), 0) > 0 and moved.get(("B", "A"), 0) > 0


def test_a_policy_that_starts_late_trains_round_zero_with_its_peer(
        services: _Services, warm_policies: dict[str, Path], tmp_path: Path) -> None:
    """No stall on start: B loads (and registers with MWRA) 2 s after A is ready for
    round 0. A waits for B to register (`services.peers_wait_s`), so round 0 is planned for
    both: each trains it on half the pool, not A on all of it, and A's SGT read of round 0
    finds B's records instead of waiting out the deadline (`_run_pair` asserts no round fell
    back). A peer registering after the plan was made is taken in by MWRA (integration tests)."""
    start = time.monotonic()
    _, rows = _run_pair(services, warm_policies, {"kind": "sgt", "deadline_seconds": 15.0},
                        tmp_path, stagger=2.0)
    assert rows["A"][0]["peers_complete"] == 1.0 and rows["A"][0]["fallback"] == 0.0
    assert rows["A"][0]["threads"] == 1.0 == rows["B"][0]["threads"]
    # B neither sat round 0 out waiting for a turn (60 s) nor made A wait out its deadline
    assert time.monotonic() - start < 120


def test_xgrpo_pools_both_ways(services: _Services, warm_policies: dict[str, Path],
                               tmp_path: Path) -> None:
    _, rows = _run_pair(services, warm_policies, {"kind": "xgrpo"}, tmp_path)
    for n in ("A", "B"):
        assert sum(r["peer_prompts"] for r in rows[n]) == ROUNDS * 8, n
        # Complementary skills: pooling moves the baseline.
        assert max(r["baseline_shift"] for r in rows[n]) > 0, n


def test_prp_pools_peer_rollouts_through_thl(services: _Services,
                                             warm_policies: dict[str, Path],
                                             tmp_path: Path) -> None:
    from mutualrl.v1 import experience_pb2 as pb

    stats, rows = _run_pair(services, warm_policies,
                            {"kind": "prp", "prp_weight_mode": "truncate", "prp_level": "chunk"},
                            tmp_path)
    for n in ("A", "B"):
        assert sum(r["peer_samples"] for r in rows[n]) > 0, n
        assert all(0.0 <= r["prp_w_kept"] <= 1.0 for r in rows[n] if "prp_w_kept" in r)
        # Different tokenizers: some receiver tokens sit in multi-token chunks.
        assert any(r.get("thl_multi_token_chunk_share", 0.0) > 0 for r in rows[n]), n
    moved = _transfers(stats, pb.ROLLOUT)
    assert moved.get(("A", "B"), 0) > 0 and moved.get(("B", "A"), 0) > 0


@pytest.mark.parametrize("kind", ["hacpo", "sapo", "ftis"])
def test_published_methods_train_on_each_others_rollouts(
        services: _Services, warm_policies: dict[str, Path], tmp_path: Path, kind: str) -> None:
    """HACPO, SAPO and F-TIS through SEE and the THL service, both ways: each policy reads its
    peer's rollouts (HACPO its reward statistics too) and trains on them in its own tokens."""
    from mutualrl.v1 import experience_pb2 as pb

    stats, rows = _run_pair(services, warm_policies, {"kind": kind}, tmp_path)
    moved = _transfers(stats, pb.ROLLOUT)
    assert moved.get(("A", "B"), 0) > 0 and moved.get(("B", "A"), 0) > 0
    for n, peer in (("A", "B"), ("B", "A")):
        read = [r for r in rows[n] if "peer_read" in r or "peer_fetched" in r]
        assert read, n
        if kind == "hacpo":
            # Every peer row joins the group, and both capabilities are known every round.
            assert all(r["peer_samples"] > 0 for r in rows[n][1:]), n
            assert all(f"hacpo_P/{peer}" in r and f"hacpo_P/{n}" in r for r in rows[n][1:]), n
            assert any(0.0 <= r.get("hacpo_s_below", -1.0) <= 1.0 for r in rows[n]), n
        elif kind == "sapo":
            # Whole groups come in; those with equal rewards are dropped.
            assert sum(r.get("sapo_groups", 0.0) + r.get("sapo_groups_dropped", 0.0)
                       for r in rows[n]) > 0, n
        else:
            assert sum(r["peer_samples"] for r in rows[n]) > 0, n
            assert any(r.get("ftis_kl", 0.0) > 0 for r in rows[n]), n
            assert any(r.get("thl_multi_token_chunk_share", 0.0) > 0 for r in rows[n]), n
    if kind == "hacpo":
        stats_moved = _transfers(stats, pb.REWARD_STATS)
        assert stats_moved.get(("A", "B"), 0) > 0 and stats_moved.get(("B", "A"), 0) > 0


def test_sgt_controls_train_on_own_successes_and_reference_answers(
        services: _Services, warm_policies: dict[str, Path], tmp_path: Path) -> None:
    """sgt-self and oracle read what SGT reads (the prompts it would rescue) and train on
    other demonstrations: B's own earlier successes, and the task's reference answers."""
    for kind in ("sgt-self", "oracle"):
        _, rows = _run_pair(services, warm_policies, {"kind": kind, "sgt_lambda": 0.5},
                            tmp_path / kind)
        for n in ("A", "B"):
            assert sum(r["rescued_prompts"] for r in rows[n]) > 0, (kind, n)
            # sgt-self has no own success before round 1; after that it has demonstrations.
            assert any(r.get("loss_sgt", 0.0) > 0 for r in rows[n][1:]), (kind, n)
        if kind == "sgt-self":
            assert all("sgt_self_missing" in r for r in rows["A"] if r["rescued_prompts"])


def test_three_policies_on_two_units_share_every_round(services: _Services,
                                                       warm_policies: dict[str, Path],
                                                       tmp_path: Path) -> None:
    """Three policies on a two-thread pool: MWRA shares it (nobody waits for a turn), SGT
    rescues B's `add` from both A and C, and A's and C's `rev` from B; the stability-support
    diagnostics are measured every round."""
    from mutualrl.v1 import experience_pb2 as pb

    stats, rows = _run_pair(services, warm_policies, {"kind": "sgt", "deadline_seconds": 5.0},
                            tmp_path, names=("A", "B", "C"), slots=2,
                            diagnostics={"support_every": 1, "kl_every": 1, "kl_samples": 8})
    for n in ("A", "B", "C"):
        assert all(r["threads"] == 1.0 for r in rows[n]), n
        # No round waits for a turn nor for a peer's turn (before the fix: ~5 s a round).
        assert max(r["step_s"] for r in rows[n][1:]) < 4.0, [r["step_s"] for r in rows[n]]
        assert all(r["kl_warm"] >= 0.0 for r in rows[n])
        assert any("support_logp" in r for r in rows[n])
    moved = _transfers(stats, pb.VERIFIED_SUCCESS)
    for taker, source in (("B", "A"), ("B", "C"), ("A", "B"), ("C", "B")):
        assert moved.get((taker, source), 0) > 0, (taker, source, moved)
    demos = {k for r in rows["B"] for k in r if k.startswith("rescue_demos/")}
    assert {"rescue_demos/add/A", "rescue_demos/add/C"} <= demos, demos


def test_three_policies_taking_turns_never_wait_out_the_deadline(
        services: _Services, warm_policies: dict[str, Path], tmp_path: Path) -> None:
    """MWRA time-share (what GPUs get when they are fewer than the policies): turns within each
    round, and each turn reads only the policies that trained before or with it, so no round
    waits out the SGT deadline (it used to: ~5 s a round) and every policy trains every
    round."""
    from mutualrl.mwra.config import MwraConfig
    from mutualrl.mwra.server import start_mwra

    mwra = services.call(start_mwra(MwraConfig(
        redis_url=REDIS_URL, port=0, metrics_port=None, auth_token=None, grace_seconds=0.2,
        short_pool="time-share", tick_seconds=0.05,
        key_prefix=services.prefix)))  # the module's DeleteRun at teardown finds its keys
    address, services.mwra = services.mwra, mwra.address
    try:
        _, rows = _run_pair(services, warm_policies, {"kind": "sgt", "deadline_seconds": 5.0},
                            tmp_path, names=("A", "B", "C"), slots=2)
    finally:
        services.mwra = address
        services.call(mwra.stop(0.2))
    for n in ("A", "B", "C"):
        # Every read found every policy it waited for (those of its turn and earlier ones):
        # none ran into the deadline waiting for a policy whose turn had not come.
        assert all(r["peers_complete"] == 1.0 for r in rows[n]), (n, rows[n])
        assert all(r["fallback"] == 0.0 for r in rows[n]), n
    # B (alone in some turns, after A and C in others) rescued prompts from its peers.
    assert sum(r["rescued_prompts"] for r in rows["B"]) > 0


def test_dead_or_silent_peers_fall_back_to_grpo(services: _Services) -> None:
    """A dead SEE, or a live one where the peer never publishes, costs at most the deadline
    and the round is plain GRPO (counted)."""
    import time

    from mutualrl.trainer.algos.loss import group_advantages
    from mutualrl.trainer.config.run import ExchangeSettings, ProbeSettings
    from mutualrl.trainer.data.tasks import Prompt
    from mutualrl.trainer.sharing.exchange import PeerExchange
    from mutualrl.trainer.sharing.probes import RoundData, make_probe

    prompts = [Prompt(id=f"q{i}", skill="add", text=f"q{i}", answer="1") for i in range(2)]
    data = RoundData(round=0, prompts=prompts, samples=[[], []],
                     rewards=torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    run_id = f"e2e-silent-{uuid.uuid4().hex[:6]}"
    services.see_only_runs.append(run_id)
    live = PeerExchange(run_id, "A", "tok-A", services.see, None, None, timeout=5.0)
    live.client.create_run(run_id, ["A", "B"], 1.0, exist_ok=True)
    dead = PeerExchange(run_id, "A", "tok-A", "127.0.0.1:1", None, None, timeout=2.0)
    for ex in (live, dead):
        for kind in ("xgrpo", "sgt", "prp", "sgt-self", "oracle"):
            # no lead bound: the round waits for the peer up to the deadline only
            probe = make_probe(ProbeSettings(kind=kind, deadline_seconds=0.5), "A", ex,
                               sharing=ExchangeSettings(max_lead_rounds=None))
            t0 = time.monotonic()
            plan = probe.plan(data)
            assert time.monotonic() - t0 < 3.0, kind
            assert plan.stats["fallback"] == 1.0 and probe.fallbacks == 1, kind
            assert torch.equal(plan.advantages, group_advantages(data.rewards)), kind
            assert plan.peers is None and plan.demos is None
        ex.close()


def test_prp_keeps_rollouts_of_a_peer_that_is_ahead(services: _Services,
                                                    warm_policies: dict[str, Path]) -> None:
    """SEE hands a record out once: rollouts of a round the receiver has not reached yet must
    wait in the probe for that round (peers may run a round apart)."""
    from mutualrl.trainer.config.run import ProbeSettings
    from mutualrl.trainer.data.tasks import Prompt
    from mutualrl.trainer.engines.base import Sample, completion_offsets
    from mutualrl.trainer.runtime.presets import load_policy
    from mutualrl.trainer.sharing.exchange import PeerExchange, round_records
    from mutualrl.trainer.sharing.probes import RoundData, make_probe

    run_id = f"e2e-ahead-{uuid.uuid4().hex[:6]}"
    services.see_only_runs.append(run_id)
    toks = {n: load_policy(warm_policies[n])[1] for n in ("A", "B")}
    tok_ids = {n: f"{run_id}/{n}" for n in ("A", "B")}
    ex = {n: PeerExchange(run_id, n, tok_ids[n], services.see, None, toks[n], timeout=5.0)
          for n in ("A", "B")}
    ex["A"].join(["A", "B"], {tok_ids[n]: str(warm_policies[n]) for n in ("A", "B")})

    def sample(n: str, text: str) -> Sample:
        ids = toks[n](text, add_special_tokens=False)["input_ids"]
        decoded, offsets = completion_offsets(toks[n], ids)
        return Sample(0, ids, decoded, offsets, [-0.5] * len(ids), "stop")

    prompts = {k: Prompt(id=f"rev:{k}{k + 1}=", skill="rev", text=f"rev:{k}{k + 1}=",
                         answer=f"{k + 1}{k}") for k in (0, 1)}
    texts = {k: [f"{k + 1}{k};", "77;"] for k in (0, 1)}
    for k in (0, 1):  # B is a round ahead: both of its rounds are in SEE before A reads
        rows = [[sample("B", t) for t in texts[k]]]
        ex["B"].publish(round_records(run_id, "B", k, k, tok_ids["B"], [prompts[k]], rows,
                                      [[1.0, 0.0]], [[True, False]], 1.0))
    probe = make_probe(ProbeSettings(kind="prp", deadline_seconds=2.0), "A", ex["A"])
    for k in (0, 1):
        own = [[sample("A", "00;"), sample("A", "11;")]]
        ex["A"].publish(round_records(run_id, "A", k, k, tok_ids["A"], [prompts[k]], own,
                                      [[0.0, 0.0]], [[False, False]], 1.0))
        plan = probe.plan(RoundData(k, [prompts[k]], own, torch.zeros(1, 2)))
        assert plan.stats["fallback"] == 0.0
        assert plan.peers is not None and len(plan.peers.token_ids) == 2, k
        assert len(probe.pending) == (2 if k == 0 else 0)
        assert plan.stats["peer_fetched"] == (4 if k == 0 else 0)
        # Own all-fail group pooled with one peer success: own advantages turn negative.
        assert bool((plan.advantages < 0).all())
    for e in ex.values():
        e.close()
