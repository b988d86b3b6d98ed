"""Every RPC a trainer's sharing code makes is allowed with the trainer's own policy token: two
trainers, each holding only its policy's token, walk everything a round does against real SEE,
THL and MWRA servers with the run's secret set (join, both publishes, the deterministic mode's
wait for a round, peer stats, successes, rollouts and their acks, retokenization, alignment,
MWRA's registration, the policy heartbeat a trainer sends while it waits for its peers to
register, allocation and cost report, and the live metric rows). The servers' own
call counter (`mutualrl_grpc_requests`, by method and status) shows which methods were called
and that none was refused."""

from __future__ import annotations

import asyncio
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from prometheus_client import REGISTRY
from transformers import AutoTokenizer

from mutualrl.bench.testing.see import make_config, running_see
from mutualrl.bench.testing.thl import trained_tokenizers
from mutualrl.client.see import AsyncSeeClient
from mutualrl.common.auth import derive_token
from mutualrl.common.channel import ClientOptions
from mutualrl.trainer.data.tasks import Prompt
from mutualrl.trainer.engines.base import Sample
from mutualrl.trainer.runtime.allocator import AllocatorClient
from mutualrl.trainer.runtime.live_metrics import SeeMetricsReporter
from mutualrl.trainer.sharing.exchange import PeerExchange, round_records

pytestmark = pytest.mark.timeout(180)

SECRET = "walk-secret-5d2"
POLICIES = ("A", "B")
# Every method a trainer calls in a run with services (the walk below must reach each).
EXPECTED = {
    "mutualrl.v1.ExperienceExchange": {"GetRun", "Publish", "GetRoundStats",
                                       "GetVerifiedSuccesses", "FetchRollouts", "Ack"},
    "mutualrl.v1.Alignment": {"RegisterTokenizer", "Retokenize", "AlignTrace"},
    "mutualrl.v1.Allocator": {"RegisterPolicy", "PolicyHeartbeat", "GetAllocation",
                              "ReportStepCost", "DeregisterPolicy"},
    "mutualrl.v1.RunMetrics": {"ReportMetrics"},
}


def _calls() -> dict[tuple[str, str], float]:
    """The servers' call counter: (full method, status code) -> calls so far."""
    out: dict[tuple[str, str], float] = {}
    for metric in REGISTRY.collect():
        if metric.name != "mutualrl_grpc_requests":
            continue
        for s in metric.samples:
            if s.name.endswith("_total"):
                out[(s.labels["method"], s.labels["code"])] = s.value
    return out


def _round(run_id: str, policy: str, tok: Any) -> list[Any]:
    """A round of two prompts, two samples each; the first sample of each solves it."""
    prompts = [Prompt(id=f"q{i}", skill="add", text=f"{i}+1=", answer=str(i + 1))
               for i in range(2)]
    samples = []
    for p in prompts:
        row = []
        for text in (p.answer, "no"):
            ids = list(tok(text, add_special_tokens=False)["input_ids"])
            row.append(Sample(0, ids, text, [(0, len(text))] + [(len(text), len(text))] * (
                len(ids) - 1), [-0.5] * len(ids), "stop"))
        samples.append(row)
    rewards = [[1.0 + 0.1, 0.1] for _ in prompts]  # a weighted total of two reward functions
    return round_records(run_id, policy, 0, 0, f"{run_id}/{policy}", prompts, samples, rewards,
                         [[True, False] for _ in prompts], 1.0, None,
                         success=[[1.0, 0.0] for _ in prompts])


def _walk(see: str, thl: str, mwra: str, run_id: str, tokenizer: str,
          before: dict[tuple[str, str], float]) -> dict[str, Any]:
    """What each trainer's round does, with its own policy token only (`before`: the call
    counter before the walk)."""
    tok = AutoTokenizer.from_pretrained(tokenizer)
    ex = {p: PeerExchange(run_id, p, f"{run_id}/{p}", see, thl, tok,
                          token=derive_token(SECRET, f"policy:{p}"), timeout=10, tau=1.0,
                          outage_budget=0, reads_within_deadline=False)
          for p in POLICIES}

    def allocator(p: str) -> AllocatorClient:
        return AllocatorClient(mwra, run_id, p, 1, 4, token=derive_token(SECRET, f"policy:{p}"),
                               timeout=10, outage_budget=0, peers=POLICIES, peers_wait_s=60)

    alloc = {"A": allocator("A")}
    got: dict[str, Any] = {}
    try:
        for p in POLICIES:
            ex[p].join(POLICIES, {f"{run_id}/{p}": tokenizer})
        ex["A"].publish_soon(_round(run_id, "A", tok))  # the deterministic mode's publish
        ex["A"].flush()
        assert ex["B"].publish(_round(run_id, "B", tok))  # the asynchronous mode's
        # A asks for round 0 before B registers: it waits for B, beating its policy lease
        # (every 10 s) meanwhile; B registers once A has beaten.
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(alloc["A"].allocation, 0)
            deadline = time.monotonic() + 30
            while not any(m.endswith("/PolicyHeartbeat") and c == "OK"
                          and n > before.get((m, c), 0) for (m, c), n in _calls().items()):
                assert time.monotonic() < deadline, "A sent no PolicyHeartbeat while it waited"
                assert not first.done(), "A's round 0 did not wait for B to register"
                time.sleep(0.2)
            alloc["B"] = allocator("B")
            first.result(timeout=30)
        alloc["B"].allocation(0)
        for p in POLICIES:
            ex[p].await_round(0, ["q0", "q1"], timeout_s=10)
        deadline = time.monotonic() + 10
        for p in POLICIES:
            _, best, complete = ex[p].peer_stats(0, ["q0", "q1"], deadline)
            per_policy, _ = ex[p].policy_stats(0, ["q0", "q1"], deadline)
            successes = ex[p].peer_successes(["q0", "q1"], 0, 4, deadline)
            rollouts = ex[p].peer_rollouts(0, 1, 16, deadline)
            aligned = ex[p].align(rollouts, chunk_level=True)
            demos = ex[p].retokenize([s.text for s in successes])
            alloc[p].report(0, 0.5, 8, 4)
            got[p] = dict(best=best, complete=complete, per_policy=sorted(per_policy),
                          successes=len(successes), rollouts=len(rollouts),
                          aligned=len(aligned), demos=len(demos),
                          published=ex[p].published)
            live = SeeMetricsReporter(see, run_id, p, token=derive_token(SECRET, f"policy:{p}"))
            live.report(0, {"reward_mean": 0.5})
            live.close()
            got[p]["metric_rows"] = live.sent
        alloc["A"].leave()  # its last round done: A deregisters, as its own policy
        assert alloc["B"].client is not None
        table = alloc["B"].client.list_allocations(run_id)
        got["B"]["mwra_after_A_left"] = sorted(x.policy_id for x in table.policies)
    finally:
        for p in POLICIES:
            ex[p].close()
        for a in alloc.values():
            a.close()
    return got


async def test_every_rpc_of_a_trainer_is_allowed_with_its_policy_token(
        redis_url: str, run_id: str) -> None:
    """Catches an RPC a trainer makes that its policy token may not (a method denied) and a
    wait for peers without the policy heartbeat that keeps the waiting policy's MWRA lease
    (planted: `AllocatorClient._await_peers` without its `policy_keepalive`: "A sent no
    PolicyHeartbeat while it waited")."""
    from mutualrl.mwra.config import MwraConfig
    from mutualrl.mwra.server import start_mwra
    from mutualrl.thl.config import ThlConfig
    from mutualrl.thl.server import start_thl

    tokenizer = trained_tokenizers()["char"]
    common = {"port": 0, "metrics_port": None, "redis_url": redis_url, "key_prefix": run_id,
              "auth_token": SECRET}
    thl = await start_thl(ThlConfig.model_validate(
        {**common, "tokenizer_roots": [tempfile.gettempdir()]}))
    mwra = await start_mwra(MwraConfig.model_validate(common))
    before = _calls()
    try:
        async with running_see(make_config(redis_url, auth_token=SECRET)) as see:
            async with AsyncSeeClient(ClientOptions(address=see.address, token=SECRET)) as admin:
                await admin.create_run(run_id, list(POLICIES), 1.0)
            got = await asyncio.to_thread(_walk, see.address, thl.address, mwra.address, run_id,
                                          tokenizer, before)
    finally:
        await thl.stop(0)
        await mwra.stop(0)
    after = _calls()
    new = {key: after[key] - before.get(key, 0.0) for key in after
           if after[key] > before.get(key, 0.0)}
    called: dict[str, set[str]] = {}
    for method, _ in new:
        service, name = method.strip("/").split("/")
        called.setdefault(service, set()).add(name)
    denied = {m: n for (m, c), n in new.items() if c in ("PERMISSION_DENIED", "UNAUTHENTICATED")}
    assert not denied, denied
    for service, methods in EXPECTED.items():
        assert methods <= called.get(service, set()), (service, called.get(service))
    assert {c for _, c in new} <= {"OK"}, new  # nothing refused for any other reason either
    for p, peer in (("A", "B"), ("B", "A")):  # and every read found the peer's records
        g = got[p]
        assert g["complete"] and g["best"] == {"q0": 1.0, "q1": 1.0}, g
        assert g["per_policy"] == [peer] and g["successes"] == 2, g
        assert g["rollouts"] == 4 and g["aligned"] == 4 and g["demos"] == 2, g
        assert g["published"] == 2 * 2 + 2 + 2 and g["metric_rows"] == 1, g
    assert got["B"]["mwra_after_A_left"] == ["B"]  # A's leave was taken
