"""Same seed, same run: in the deterministic exchange mode, trainers sharing through real SEE
and MWRA servers (in-process, port 0, real Redis under a private key prefix; THL in-process)
produce the same metrics and the same final parameters, bit for bit, whatever order they start
in and however slow one of them is; another seed gives another run.

The slow policy's rollouts take longer than the probe's deadline and MWRA grants threads by
measured step time, so the asynchronous mode, which falls back at the deadline and follows
MWRA's grants, fails this test."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from service_loop import LoopThread, delete_keys
from warm_start import TASK, WARM, start_training, warm_checkpoints

torch.set_num_threads(1)
pytestmark = pytest.mark.timeout(360)  # above the 300 s a run's thread is joined for

ROUNDS = 3
DEADLINE_S = 0.5
SLOW_S = 1.0  # before each of the slow policy's rollouts: past the others' deadline
Run = tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, torch.Tensor]]]


@pytest.fixture(scope="module")
def warm_policies(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return warm_checkpoints(request, tmp_path_factory)


@dataclass
class _Services:
    see: str
    mwra: str


@pytest.fixture(scope="module")
def services(redis_url: str) -> Iterator[_Services]:
    from mutualrl.mwra.config import MwraConfig
    from mutualrl.mwra.server import start_mwra
    from mutualrl.see.config import SeeConfig
    from mutualrl.see.server import start_see

    loop = LoopThread("services")
    prefix = f"det{uuid.uuid4().hex[:10]}"
    common = dict(port=0, metrics_port=None, auth_token=None, grace_seconds=0.2,
                  key_prefix=prefix, redis_url=redis_url)
    see = loop.run(start_see(SeeConfig(rest_port=None, **common)))
    mwra = loop.run(start_mwra(MwraConfig(**common)))
    try:
        yield _Services(see.address, mwra.address)
    finally:
        for server in (see, mwra):
            loop.run(server.stop(0.2))
        loop.close()
        delete_keys(redis_url, f"{prefix}:*")


def _config(svc: _Services, warm: dict[str, Path], names: tuple[str, ...], probe: dict[str, Any],
            staleness: int, seed: int, out: Path, liveness: float = 60.0) -> Any:
    from mutualrl.trainer.config.run import TrainerConfig

    return TrainerConfig.model_validate({
        "run_id": f"det-{uuid.uuid4().hex[:8]}", "seed": seed, "output_dir": str(out),
        "task": TASK,
        "grpo": {"group_size": 4, "prompts_per_round": 4, "rounds": ROUNDS, "lr": 3e-4},
        "probe": {"deadline_seconds": DEADLINE_S, **probe},
        "exchange": {"mode": "deterministic", "staleness": staleness,
                     "liveness_timeout_s": liveness},
        "eval": {"every": 0}, "checkpoint": {"every": 0},
        "metrics": {"tensorboard": False, "progress": False, "see": False},
        "services": {"see": svc.see, "thl": None, "mwra": svc.mwra, "peers_wait_s": 10.0},
        "policies": [{"name": n, "preset": WARM[n][0], "sft_checkpoint": str(warm[n])}
                     for n in names],
    })


def _train(svc: _Services, cfg: Any, order: tuple[str, ...], slow: str | None,
           out: Path) -> Run:
    """Train the policies of `cfg` on an MWRA worker of 2 slots, each in a thread started as
    soon as its session is built, in `order`, 0.3 s apart; `slow`'s every rollout sleeps
    SLOW_S first. Returns metrics rows and final parameters per policy."""
    from mutualrl.client.mwra import MwraClient
    from mutualrl.trainer.runtime.session import build_session

    mwra = MwraClient(svc.mwra)
    mwra.register_local_worker(cfg.run_id, "det-worker", slots=2)
    keep = mwra.keepalive(cfg.run_id, "det-worker", 2.0)

    sessions: dict[str, Any] = {}
    errors: list[BaseException] = []

    threads = []
    for name in order:
        s = sessions[name] = build_session(cfg, name, cache_dir=out / "presets")
        if name == slow:
            s.engine.generate = _slowed(s.engine.generate)
        threads.append(start_training(s, errors))
        time.sleep(0.3)
    for t in threads:
        t.join(timeout=300)
    for s in sessions.values():
        s.close()
    keep.stop()
    mwra.close()
    assert not errors, errors
    rows = {n: [json.loads(x) for x in (cfg.run_dir(n) / "metrics.jsonl").read_text().splitlines()]
            for n in order}
    params = {n: {k: v.detach().clone() for k, v in s.model.state_dict().items()}
              for n, s in sessions.items()}
    return rows, params


def _slowed(generate: Any) -> Any:
    def slowed(*a: Any, **k: Any) -> Any:
        time.sleep(SLOW_S)
        return generate(*a, **k)

    return slowed


def _comparable(run: Run) -> dict[str, list[dict[str, Any]]]:
    from mutualrl.trainer.runtime.determinism import comparable

    return {n: [comparable(r) for r in rs] for n, rs in sorted(run[0].items())}


def _same_params(a: Run, b: Run) -> bool:
    return all(torch.equal(a[1][n][k], b[1][n][k]) for n in a[1] for k in a[1][n])


@pytest.mark.parametrize(("names", "probe", "staleness"), [
    (("A", "B"), {"kind": "sgt"}, 0),
    (("A", "B"), {"kind": "prp", "prp_weight_mode": "truncate", "prp_level": "chunk"}, 1),
    (("A", "B", "C"), {"kind": "sgt"}, 1),
    (("A", "B", "C"), {"kind": "prp", "prp_weight_mode": "truncate"}, 0),
    (("A", "B"), {"kind": "hacpo"}, 1),
], ids=["sgt-n2-s0", "prp-n2-s1", "sgt-n3-s1", "prp-n3-s0", "hacpo-n2-s1"])
def test_same_seed_same_run_whatever_the_timing(
        services: _Services, warm_policies: dict[str, Path], tmp_path: Path, names: tuple[str, ...],
        probe: dict[str, Any], staleness: int) -> None:
    def run(seed: int, order: tuple[str, ...], slow: str, tag: str) -> Run:
        cfg = _config(services, warm_policies, names, probe, staleness, seed, tmp_path / tag)
        return _train(services, cfg, order, slow, tmp_path / tag)

    first = run(0, names, names[0], "first")
    second = run(0, names[::-1], names[-1], "second")  # other start order, other slow one
    other = run(1, names, names[0], "other")
    rows = first[0]
    for n in names:
        assert [r["round"] for r in rows[n]] == list(range(ROUNDS)), n
        assert all(r["fallback"] == 0.0 for r in rows[n]), n
    # Peers' data entered the runs, so the equality below is about shared data.
    key = "rescued_prompts" if probe["kind"] == "sgt" else "peer_samples"
    assert sum(r.get(key, 0.0) for n in names for r in rows[n]) > 0, key
    if staleness:  # round r used the peers' round r - s
        assert all(r.get("peer_round", 0.0) == r["round"] - staleness
                   for n in names for r in rows[n][staleness:])
    assert _comparable(first) == _comparable(second)
    assert _same_params(first, second)
    assert _comparable(first) != _comparable(other)
    assert not _same_params(first, other)


def test_a_peer_that_never_comes_fails_the_run_with_a_clear_error(
        services: _Services, warm_policies: dict[str, Path], tmp_path: Path) -> None:
    """Deterministic mode never falls back: past the liveness bound the round raises, naming
    the missing peer, the round and the setting."""
    from mutualrl.trainer.runtime.loop import train
    from mutualrl.trainer.runtime.session import build_session
    from mutualrl.trainer.sharing.exchange import PeerTimeout

    cfg = _config(services, warm_policies, ("A", "B"), {"kind": "sgt"}, 0, 0, tmp_path,
                  liveness=1.0)
    s = build_session(cfg, "A", cache_dir=tmp_path / "presets")
    start = time.monotonic()
    try:
        with pytest.raises(PeerTimeout, match=r"round 0: B did not publish.*"
                                              r"exchange\.liveness_timeout_s=1 s"):
            train(s)
    finally:
        s.close()
    assert time.monotonic() - start < 30
