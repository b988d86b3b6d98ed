"""The trainer's side of MWRA (`runtime/allocator.py`) against a real MWRA and real Redis: the
granted threads and rollout workers arrive in `RoundAllocation`, the rollout and update seconds
reach MWRA, and a policy its peers wait for gets their threads."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from service_loop import in_process

from mutualrl.client.mwra import MwraClient
from mutualrl.mwra.config import MwraConfig
from mutualrl.mwra.server import start_mwra
from mutualrl.trainer.runtime.allocator import AllocatorClient

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def mwra(redis_url: str) -> Iterator[str]:
    with in_process(redis_url, "arw", lambda prefix: start_mwra(MwraConfig(
            port=0, metrics_port=None, auth_token=None, grace_seconds=0.2, key_prefix=prefix,
            redis_url=redis_url, smoothing=1.0))) as server:
        yield server.address


def test_rollout_workers_and_their_costs_travel_both_ways(mwra: str) -> None:
    run_id = f"rw-{uuid.uuid4().hex[:6]}"
    with MwraClient(mwra) as admin:
        admin.register_worker(run_id, "local", cpu_slots=4)
        keep = admin.keepalive(run_id, "local", 0.5)
        a = AllocatorClient(mwra, run_id, "a", 1, 8, max_rollout_workers=1)
        try:
            first = a.allocation(0)
            assert (first.threads, first.rollout_workers, first.rollout_threads,
                    first.rollout_units) == (4, 1, 2, 2)
            # rollouts 1 s on 2 threads, update 3 s on the other 2: the update needs more
            a.report(0, 4.0, 100, 8, rollout_s=1.0, update_s=3.0)
            (info,) = admin.list_allocations(run_id).policies
            assert (info.max_rollout_workers, info.smoothed_rollout_cost,
                    info.smoothed_update_cost) == (1, 2.0, 6.0)
            second = a.allocation(1)
            assert (second.rollout_workers, second.rollout_threads) == (1, 1)
        finally:
            keep.stop()
            a.close()


def test_a_policy_its_peers_wait_for_gets_their_threads(mwra: str) -> None:
    """Three trainers on two threads; smol's round is 52 s of work, llama's 11 s and qwen's 1 s
    (each waited the rest of smol's round, which its cost leaves out): smol gets both threads."""
    run_id = f"slow-{uuid.uuid4().hex[:6]}"
    with MwraClient(mwra) as admin:
        admin.register_worker(run_id, "local", cpu_slots=2)
        keep = admin.keepalive(run_id, "local", 0.5)
        ids = ("smol", "llama", "qwen")
        trainers = {p: AllocatorClient(mwra, run_id, p, 1, 8, peers=ids, peers_wait_s=10.0)
                    for p in ids}
        try:
            assert {p: t.allocation(0).threads for p, t in trainers.items()} == \
                dict.fromkeys(ids, 1)
            for p, cost in zip(ids, (52.0, 11.0, 1.0), strict=True):
                trainers[p].report(0, cost, 100, 8)
            assert {p: t.allocation(1).threads for p, t in trainers.items()} == \
                {"smol": 2, "llama": 1, "qwen": 1}
        finally:
            keep.stop()
            for t in trainers.values():
                t.close()


def test_without_mwra_the_configured_workers_run_on_half_the_threads() -> None:
    fixed = AllocatorClient(None, "r", "p", 4, 8, max_rollout_workers=1).allocation(0)
    assert (fixed.threads, fixed.rollout_workers, fixed.rollout_threads) == (4, 1, 2)
    none = AllocatorClient(None, "r", "p", 4, 8).allocation(0)
    assert (none.rollout_workers, none.rollout_threads) == (0, 0)
