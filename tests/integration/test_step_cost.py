"""The step cost a trainer reports to MWRA is its own work: a round that waits out the deadline
for a silent peer reports the round's time minus the wait (real SEE, real MWRA, THL in-process)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from service_loop import LoopThread, delete_keys

DEADLINE_S = 1.5


@pytest.fixture(scope="module")
def services(redis_url: str) -> Iterator[dict[str, str]]:
    from mutualrl.mwra.config import MwraConfig
    from mutualrl.mwra.server import start_mwra
    from mutualrl.see.config import SeeConfig
    from mutualrl.see.server import start_see

    loop = LoopThread("step-cost")
    call = loop.run
    prefix = f"cost{uuid.uuid4().hex[:10]}"
    common: dict[str, Any] = dict(port=0, metrics_port=None, auth_token=None,
                                  grace_seconds=0.2, key_prefix=prefix, redis_url=redis_url)
    see = call(start_see(SeeConfig(rest_port=None, **common)))
    mwra = call(start_mwra(MwraConfig(**common)))
    turns = call(start_mwra(MwraConfig(short_pool="time-share", **common)))
    try:
        yield {"see": see.address, "mwra": mwra.address, "mwra_turns": turns.address}
    finally:
        for server in (see, mwra, turns):
            call(server.stop(0.2))
        loop.close()
        delete_keys(redis_url, f"{prefix}:*")


def test_reported_cost_excludes_the_wait_for_a_silent_peer(services: dict[str, str],
                                                           tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    from mutualrl.client.mwra import MwraClient
    from mutualrl.trainer.config.run import TrainerConfig
    from mutualrl.trainer.runtime.loop import run_round
    from mutualrl.trainer.runtime.session import build_session

    monkeypatch.delenv("MUTUALRL_AUTH_TOKEN", raising=False)
    run_id = f"cost-{uuid.uuid4().hex[:6]}"
    cfg = TrainerConfig.model_validate({
        "run_id": run_id, "output_dir": str(tmp_path),
        "grpo": {"group_size": 2, "prompts_per_round": 2, "rounds": 1, "max_new_tokens": 4},
        "probe": {"kind": "xgrpo", "deadline_seconds": DEADLINE_S},
        "exchange": {"max_lead_rounds": None},  # B never comes: wait up to the deadline
        "eval": {"every": 0}, "checkpoint": {"every": 0},
        "metrics": {"tensorboard": False, "progress": False, "see": False},
        # B is declared but never trains: A waits for it until the deadline, every round (and
        # not, before round 0, for B to register with MWRA).
        "services": {"see": services["see"], "thl": None, "mwra": services["mwra"],
                     "peers_wait_s": 0},
        "policies": [{"name": "A", "preset": "llama-char"}, {"name": "B", "preset": "llama-char"}],
    })
    s = build_session(cfg, "A", cache_dir=tmp_path / "presets")
    try:
        m = run_round(s, 0)
    finally:
        s.close()
    assert m["fallback"] == 1.0  # the deadline passed with nothing from B
    assert m["wait_s"] >= DEADLINE_S - 0.2
    assert m["cost_s"] == pytest.approx(m["step_s"] - m["wait_s"])
    assert 0 < m["cost_s"] < m["step_s"] - (DEADLINE_S - 0.2)
    with MwraClient(services["mwra"]) as mwra:
        table = mwra.list_allocations(run_id)
    (a,) = [p for p in table.policies if p.policy_id == "A"]
    assert a.reports == 1 and a.last_round == 0
    assert a.last_seconds == pytest.approx(m["cost_s"], rel=1e-6)


def test_time_share_turn_waits_are_counted_as_waits(services: dict[str, str]) -> None:
    """One unit, two policies: the second waits for the first's turn; that wait is the
    allocator's `waited_s` (left out of its cost), the first never waits."""
    from mutualrl.client.mwra import MwraClient
    from mutualrl.trainer.runtime.allocator import AllocatorClient

    run_id = f"turns-{uuid.uuid4().hex[:6]}"
    hold_s = 1.0
    address = services["mwra_turns"]  # policies take turns when the pool is short
    with MwraClient(address) as mwra:
        mwra.register_worker(run_id, "w", cpu_slots=1)
        keep = mwra.keepalive(run_id, "w", 0.5)
        a = AllocatorClient(address, run_id, "A", 1, 8, active_wait_s=30.0)
        b = AllocatorClient(address, run_id, "B", 1, 8, active_wait_s=30.0)
        try:
            first = a.allocation(0)
            assert first.round_peers == ["A"]
            got: list[Any] = []
            waiter = threading.Thread(target=lambda: got.append(b.allocation(0)))
            waiter.start()
            time.sleep(hold_s)  # A's round: B is held until A reports it
            a.report(0, 0.1, 10, 8)
            waiter.join(timeout=30)
            assert got and got[0].round_peers == ["B"]
            assert a.waited_s == 0.0
            assert hold_s - 0.2 <= b.waited_s <= hold_s + 5.0
        finally:
            keep.stop()
            a.close()
            b.close()
