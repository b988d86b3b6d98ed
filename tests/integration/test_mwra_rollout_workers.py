"""MWRA moves threads and rollout workers by measured cost: a real server on port 0, real Redis."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import grpc
import pytest

from mutualrl.client.mwra import AsyncMwraClient
from mutualrl.common.channel import ClientOptions
from mutualrl.mwra.config import MwraConfig
from mutualrl.mwra.server import MwraServer, start_mwra
from mutualrl.v1 import allocation_pb2 as pb

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def server(redis_url: str) -> AsyncIterator[MwraServer]:
    cfg = MwraConfig.model_validate({
        "port": 0, "metrics_port": None, "redis_url": redis_url, "worker_lease_seconds": 5.0,
        "policy_lease_seconds": 30.0, "lock_ttl_seconds": 1.0, "tick_seconds": 0.05,
        "watch_poll_seconds": 0.05, "hysteresis": 0.1, "smoothing": 1.0})
    srv = await start_mwra(cfg)
    yield srv
    await srv.stop(0)


def _client(srv: MwraServer) -> AsyncMwraClient:
    return AsyncMwraClient(ClientOptions(address=srv.address, timeout=10, backoff_base=0.05))


def _split(a: pb.Allocation) -> tuple[int, int, int, int]:
    return a.threads, a.rollout_workers, a.rollout_threads, a.rollout_units


async def test_a_slow_policy_gets_the_threads_its_peers_wait_with(server: MwraServer,
                                                                  run_id: str) -> None:
    """Three policies on a 2-thread machine: while two wait most of each round for the third,
    the third gets both threads; when the other two finish it keeps the pool."""
    async with _client(server) as c:
        await c.register_worker(run_id, "local", cpu_slots=2)
        ids = ("smol", "llama", "qwen")
        for pid in ids:
            await c.register_policy(run_id, pid)
        first = {pid: await c.get_allocation(run_id, pid, 0) for pid in ids}
        assert {p: a.threads for p, a in first.items()} == dict.fromkeys(ids, 1)
        assert {a.strategy for a in first.values()} == {"shared"}
        # each round's work, waits for peers excluded: 52, 11 and 1 thread-seconds
        for pid, secs in zip(ids, (52.0, 11.0, 1.0), strict=True):
            await c.report_step_cost(run_id, pid, 0, secs, units=1)
        second = {pid: await c.get_allocation(run_id, pid, 1) for pid in ids}
        assert {p: a.threads for p, a in second.items()} == {"smol": 2, "llama": 1, "qwen": 1}
        assert second["smol"].epoch > first["smol"].epoch
        # smol slows down relative to nobody: the split is kept (no thrash)
        await c.report_step_cost(run_id, "smol", 1, 26.0, units=2)
        await c.report_step_cost(run_id, "llama", 1, 11.0, units=1)
        await c.report_step_cost(run_id, "qwen", 1, 1.0, units=1)
        third = await c.get_allocation(run_id, "smol", 2)
        assert third.threads == 2 and third.epoch == second["smol"].epoch
        # llama now is the slow one: the threads move to it
        await c.report_step_cost(run_id, "smol", 2, 2.0, units=2)
        await c.report_step_cost(run_id, "llama", 2, 60.0, units=1)
        await c.report_step_cost(run_id, "qwen", 2, 1.0, units=1)
        fourth = {pid: await c.get_allocation(run_id, pid, 3) for pid in ids}
        assert {p: a.threads for p, a in fourth.items()} == {"smol": 1, "llama": 2, "qwen": 1}
        # on a busy machine llama's round took 130 s on 2 threads, 60 s on 1: one it is
        await c.report_step_cost(run_id, "smol", 3, 2.0, units=1)
        await c.report_step_cost(run_id, "llama", 3, 130.0, units=2)
        await c.report_step_cost(run_id, "qwen", 3, 1.0, units=1)
        fifth = {pid: await c.get_allocation(run_id, pid, 4) for pid in ids}
        assert {p: a.threads for p, a in fifth.items()} == dict.fromkeys(ids, 1)


async def test_rollout_workers_split_by_measured_cost_and_move_when_a_peer_finishes(
        server: MwraServer, run_id: str) -> None:
    async with _client(server) as c:
        await c.register_worker(run_id, "local", cpu_slots=8)
        info = await c.register_policy(run_id, "a", max_rollout_workers=1)
        assert info.max_rollout_workers == 1
        await c.register_policy(run_id, "b")  # in-process rollouts only
        a0, b0 = await c.get_allocation(run_id, "a", 0), await c.get_allocation(run_id, "b", 0)
        # nothing measured yet: a's 4 threads halved between learner and rollout worker
        assert _split(a0) == (4, 1, 2, 2) and _split(b0) == (4, 0, 0, 0)
        # a: rollouts 3 s on 2 threads (6 thread-s), update 1 s on 2 threads (2 thread-s)
        ack = await c.report_step_cost(run_id, "a", 0, 4.0, units=4, rollout_seconds=3.0,
                                       update_seconds=1.0, rollout_units=2)
        assert (ack.smoothed_rollout_cost, ack.smoothed_update_cost) == (6.0, 2.0)
        assert (ack.last_rollout_seconds, ack.last_update_seconds) == (3.0, 1.0)
        await c.report_step_cost(run_id, "b", 0, 4.0, units=4, rollout_seconds=3.0,
                                 update_seconds=1.0)
        a1 = await c.get_allocation(run_id, "a", 1)
        # 4 threads in the ratio 6 : 2, so both phases take 2 s: 3 generate, 1 updates
        assert _split(a1) == (4, 1, 3, 3)
        assert await c.deregister_policy(run_id, "b")  # b trained its last round
        for _ in range(100):
            a1 = await c.get_allocation(run_id, "a", 1)
            if a1.threads == 8:
                break
            await asyncio.sleep(0.05)
        assert _split(a1) == (8, 1, 6, 6)
        table = await c.list_allocations(run_id)
        (row,) = [x for x in table.allocations if x.policy_id == "a"]
        assert (row.rollout_workers, row.rollout_threads) == (1, 6)


async def test_on_gpus_each_rollout_worker_holds_a_device(server: MwraServer,
                                                         run_id: str) -> None:
    async with _client(server) as c:
        await c.register_worker(run_id, "node", cpu_slots=32, gpu_count=4, gpu_kind="H200")
        await c.register_policy(run_id, "a", max_rollout_workers=1)
        a0 = await c.get_allocation(run_id, "a", 0)
        assert (a0.units, a0.rollout_units, a0.rollout_workers, a0.rollout_threads) == \
            (4, 1, 1, 8)
        await c.report_step_cost(run_id, "a", 0, 10.0, units=4, rollout_seconds=9.0,
                                 update_seconds=1.0, rollout_units=1)
        await c.register_policy(run_id, "a", max_rollout_workers=3)  # keeps the costs
        a1 = await c.get_allocation(run_id, "a", 1)
        # rollouts 9 GPU-s, update 3 GPU-s: 3 of 4 devices generate, one per worker
        assert (a1.rollout_units, a1.rollout_workers, a1.rollout_threads) == (3, 3, 24)


async def _expect(code: grpc.StatusCode, field: str, coro: object) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await coro  # type: ignore[misc]
    assert err.value.code() == code, err.value.details()
    assert field in (err.value.details() or ""), err.value.details()


async def test_bad_rollout_fields_are_rejected_naming_the_field(server: MwraServer,
                                                                run_id: str) -> None:
    inv = grpc.StatusCode.INVALID_ARGUMENT
    async with _client(server) as c:
        await c.register_worker(run_id, "w", cpu_slots=4)
        await c.register_policy(run_id, "p")
        await _expect(inv, "max_rollout_workers",
                      c.register_policy(run_id, "q", max_rollout_workers=-1))
        for bad in (-1.0, math.nan, math.inf):
            await _expect(inv, "rollout_seconds",
                          c.report_step_cost(run_id, "p", 0, 1.0, rollout_seconds=bad))
            await _expect(inv, "update_seconds",
                          c.report_step_cost(run_id, "p", 0, 1.0, update_seconds=bad))
        await _expect(inv, "rollout_units",
                      c.report_step_cost(run_id, "p", 0, 1.0, units=2, rollout_units=2))
        await _expect(inv, "rollout_units",
                      c.report_step_cost(run_id, "p", 0, 1.0, units=2, rollout_units=-1))
        table = await c.list_allocations(run_id)
        assert [p.policy_id for p in table.policies] == ["p"] and table.policies[0].reports == 0


async def test_inspect_allocation_shows_rollout_workers(server: MwraServer, run_id: str,
                                                        capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from mutualrl.cli import main

    monkeypatch.setenv("COLUMNS", "260")
    async with _client(server) as c:
        await c.register_worker(run_id, "local", cpu_slots=8)
        await c.register_policy(run_id, "phi", trainer_id="pod-3", max_rollout_workers=1)
        await c.get_allocation(run_id, "phi", 0)
        await c.report_step_cost(run_id, "phi", 0, 2.0, units=8, rollout_seconds=1.5,
                                 update_seconds=0.25, rollout_units=4)
        await c.get_allocation(run_id, "phi", 1)
    rc = await asyncio.to_thread(main, ["inspect", "allocation", "--run", run_id, "--addr",
                                        server.address])
    text = capsys.readouterr().out
    assert rc == 0
    # 6 thread-s of rollouts, 1 of update: on 6 or 7 of the 8 threads a round takes 1 s
    # either way, and the rollout workers get the fewer
    for needle in ("1 (6)", "6.000 / 1.000"):
        assert needle in text, text
