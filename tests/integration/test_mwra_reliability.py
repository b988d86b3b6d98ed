"""MWRA under hostile and careless clients, against the real Redis and a real server on port 0:
bounded capacities and costs, allocation of a huge pool at once, nothing kept for unknown or
idle runs, and late registrants taken into the round."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mutualrl.client.mwra import AsyncMwraClient
from mutualrl.common.channel import ClientOptions
from mutualrl.mwra.config import MwraConfig
from mutualrl.mwra.server import MwraServer, start_mwra
from mutualrl.mwra.store import MwraStore
from mutualrl.trainer.runtime.allocator import AllocatorClient

pytestmark = pytest.mark.timeout(90)
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def _cfg(redis_url: str, prefix: str, **kw: object) -> MwraConfig:
    base: dict[str, object] = {"port": 0, "metrics_port": None, "redis_url": redis_url,
                               "key_prefix": prefix, "worker_lease_seconds": 30.0,
                               "policy_lease_seconds": 30.0, "lock_ttl_seconds": 1.0,
                               "tick_seconds": 0.05, "smoothing": 1.0}
    base.update(kw)
    return MwraConfig.model_validate(base)


@pytest.fixture
async def server(redis_url: str, run_id: str) -> AsyncIterator[MwraServer]:
    srv = await start_mwra(_cfg(redis_url, run_id))
    yield srv
    await srv.stop(0)


def _client(srv: MwraServer) -> AsyncMwraClient:
    return AsyncMwraClient(ClientOptions(address=srv.address, timeout=20, outage_budget=0))


async def _invalid(field: str, call: Any) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == INVALID, err.value.details()
    assert (err.value.details() or "").startswith(f"{field}:"), err.value.details()


async def test_capacities_costs_and_weights_are_bounded_naming_the_field(
        server: MwraServer, run_id: str) -> None:
    async with _client(server) as c:
        await c.register_worker(run_id, "w", cpu_slots=8)
        await c.register_policy(run_id, "p")
        # the issue's freeze: 2^31-1 slots, then a step of 1e308 s
        await _invalid("worker.capacity.cpu_slots",
                       c.register_worker(run_id, "huge", cpu_slots=2**31 - 1))
        await _invalid("worker.capacity.gpu_count",
                       c.register_worker(run_id, "huge", gpu_count=2**31 - 1))
        await _invalid("seconds", c.report_step_cost(run_id, "p", 0, 1e308))
        await _invalid("units", c.report_step_cost(run_id, "p", 0, 1.0, units=2**31 - 1))
        await _invalid("weight", c.register_policy(run_id, "q", weight=1e308))
        await _invalid("min_units", c.register_policy(run_id, "q", min_units=2**31 - 1))
        # the limits themselves are accepted
        cfg = server.service.cfg
        await c.register_worker(run_id, "big", cpu_slots=cfg.max_worker_cpu_slots)
        info = await c.report_step_cost(run_id, "p", 0, cfg.max_step_seconds,
                                        units=cfg.max_units)
        assert info.smoothed_cost == cfg.max_step_seconds * cfg.max_units
        table = await c.list_allocations(run_id)
        assert sorted(w.worker.worker_id for w in table.workers) == ["big", "w"]
        assert [p.policy_id for p in table.policies] == ["p"]


async def test_a_pool_of_a_million_units_is_allocated_at_once_and_health_answers(
        server: MwraServer, run_id: str) -> None:
    slots = server.service.cfg.max_worker_cpu_slots
    policies = [f"p{i}" for i in range(12)]
    async with _client(server) as c:
        for i in range(16):  # 16 x 65,536 = 1,048,576 units
            await c.register_worker(run_id, f"w{i}", cpu_slots=slots)
        for pid in policies:
            await c.register_policy(run_id, pid)
        for k, pid in enumerate(policies):
            await c.report_step_cost(run_id, pid, 0, 1.0 + k, units=1)
        health = health_pb2_grpc.HealthStub(c.channel)
        round1 = asyncio.gather(*(c.get_allocation(run_id, p, 1) for p in policies))
        beat = await health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert beat.status == health_pb2.HealthCheckResponse.SERVING
        allocs = await round1
        units = {a.policy_id: a.units for a in allocs}
        assert sum(units.values()) == 16 * slots
        # min-makespan: shares proportional to the costs 1..12, within a unit
        csum = sum(1.0 + k for k in range(12))
        for k, pid in enumerate(policies):
            assert abs(units[pid] - 16 * slots * (1.0 + k) / csum) <= 1.0, (pid, units[pid])
        assert {a.round for a in allocs} == {1} and len({a.epoch for a in allocs}) == 1


async def test_unknown_runs_leave_no_keys_and_no_ticking_state(
        redis_url: str, run_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    srv = await start_mwra(_cfg(redis_url, run_id))
    ticked: list[str] = []
    store = srv.coordinator.store
    real = store.acquire_or_renew

    async def spy(run: str, replica: str, ttl: float) -> int:
        ticked.append(run)
        return await real(run, replica, ttl)

    monkeypatch.setattr(store, "acquire_or_renew", spy)  # a spy on our own store
    try:
        async with _client(srv) as c:
            await c.register_worker(run_id, "w", cpu_slots=2)  # one real run next to them
            await c.register_policy(run_id, "p")

            async def ghost(i: int) -> grpc.StatusCode:
                run = f"ghost-{i}"
                calls = (c.heartbeat(run, "w"), c.policy_heartbeat(run, "p"),
                         c.get_allocation(run, "p", 0), c.report_step_cost(run, "p", 0, 1.0),
                         c.list_allocations(run), c.deregister_worker(run, "w"))
                try:
                    await calls[i % len(calls)]
                except grpc.aio.AioRpcError as err:
                    return err.code()
                finally:
                    for other in calls:  # the coroutines not awaited
                        if other is not calls[i % len(calls)]:
                            other.close()
                return grpc.StatusCode.OK

            codes: list[grpc.StatusCode] = []
            for lo in range(0, 2000, 200):
                codes += await asyncio.gather(*(ghost(i) for i in range(lo, lo + 200)))
            # every call NOT_FOUND but DeregisterWorker, which answers removed=False
            deregisters = len(range(5, 2000, 6))
            assert codes.count(grpc.StatusCode.OK) == deregisters, set(codes)
            assert codes.count(grpc.StatusCode.NOT_FOUND) == 2000 - deregisters
            await asyncio.sleep(0.5)  # ten ticks
        assert srv.coordinator._runs == {run_id}
        assert not any(r.startswith("ghost-") for r in ticked)
        assert not any(r.startswith("ghost-") for r in srv.coordinator._locks)
        assert not any(r.startswith("ghost-") for r in srv.coordinator._leading)
        r = redis.Redis.from_url(redis_url)
        try:
            assert list(r.scan_iter(match=f"{run_id}:mwra:{{ghost-*", count=1000)) == []
        finally:
            r.close()
    finally:
        await srv.stop(0)


async def test_idle_runs_are_forgotten_and_their_lock_released(redis_url: str,
                                                               run_id: str) -> None:
    srv = await start_mwra(_cfg(redis_url, run_id, worker_lease_seconds=0.3,
                                policy_lease_seconds=0.3))
    store: MwraStore = srv.coordinator.store
    try:
        async with _client(srv) as c:
            await c.register_worker(run_id, "w", cpu_slots=2)
            await c.register_policy(run_id, "p")
            assert (await c.get_allocation(run_id, "p", 0)).units == 2
            assert await store.leader(run_id) == srv.coordinator.replica
            deadline = time.monotonic() + 10
            while run_id in srv.coordinator._runs and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert run_id not in srv.coordinator._runs  # forgotten once nothing is live
            assert await store.leader(run_id) is None  # and no lock is renewed for it
            await asyncio.sleep(0.3)
            assert await store.leader(run_id) is None
            # the run's state stays: the policy comes back and is served again
            again = await c.get_allocation(run_id, "p", 1)
            assert again.round == 1 and run_id in srv.coordinator._runs
            assert await store.leader(run_id) == srv.coordinator.replica
    finally:
        await srv.stop(0)


async def test_a_policy_that_registers_late_gets_units_in_the_same_round(
        server: MwraServer, run_id: str) -> None:
    async with _client(server) as c:
        await c.register_worker(run_id, "w", cpu_slots=4)
        await c.register_policy(run_id, "fast")
        first = await c.get_allocation(run_id, "fast", 0)
        assert first.units == 4 and first.epoch == 1 and first.active
        # a peer that loads its model more slowly registers after the first plan was made
        await c.register_policy(run_id, "slow")
        late = await c.get_allocation(run_id, "slow", 0)
        assert late.round == 0 and late.active and late.units == 2 and late.epoch == 2
        assert (await c.get_allocation(run_id, "fast", 0)).units == 2
        # one registered but not asking yet is taken in by the leader's tick
        await c.register_policy(run_id, "idle-so-far")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            table = await c.list_allocations(run_id)
            if {a.policy_id for a in table.allocations if a.active} >= {"idle-so-far"}:
                break
            await asyncio.sleep(0.05)
        held = {a.policy_id: a.units for a in table.allocations}
        assert table.round == 0 and sum(held.values()) == 4 and min(held.values()) >= 1, held


async def test_a_slow_trainer_is_active_in_round_zero_without_waiting(
        server: MwraServer, run_id: str) -> None:
    """The trainers' own client: the slower one must not wait out its active wait (60 s by
    default) for a round whose plan was made before it registered."""
    async with _client(server) as c:
        await c.register_worker(run_id, "w", cpu_slots=4)

    def trainer(policy: str) -> tuple[float, Any]:
        alloc = AllocatorClient(server.address, run_id, policy, threads=1, rollout_budget=8,
                                timeout=10.0, active_wait_s=30.0)
        try:
            start = time.monotonic()
            return time.monotonic() - start, alloc.allocation(0)
        finally:
            alloc.close()

    waited_fast, fast = await asyncio.to_thread(trainer, "fast")
    waited_slow, slow = await asyncio.to_thread(trainer, "slow")
    assert fast.units == 4 and fast.rollout_budget == 8
    assert slow.units == 2 and slow.rollout_budget == 8 and slow.epoch == 2
    assert waited_slow < 10.0, waited_slow  # not the 30 s active wait
    assert math.isfinite(waited_fast)


async def test_a_trainer_waits_for_its_peers_to_register_before_round_zero(
        server: MwraServer, run_id: str) -> None:
    """Started as separate processes, the first trainer to ask for round 0 waits for the
    policies of its config: round 0 is planned once, for both, whichever loaded first."""
    async with _client(server) as c:
        await c.register_worker(run_id, "w", cpu_slots=4)

    def trainer(policy: str) -> tuple[Any, float]:
        alloc = AllocatorClient(server.address, run_id, policy, threads=1, rollout_budget=8,
                                timeout=10.0, peers=["fast", "slow"], peers_wait_s=20.0)
        try:
            return alloc.allocation(0), alloc.waited_s
        finally:
            alloc.close()

    first = asyncio.create_task(asyncio.to_thread(trainer, "fast"))
    await asyncio.sleep(1.0)  # "slow" is still loading its model
    slow, slow_waited = await asyncio.to_thread(trainer, "slow")
    fast, fast_waited = await first
    assert fast.units == 2 and slow.units == 2
    assert fast.epoch == slow.epoch
    assert 0.8 <= fast_waited < 10.0 and slow_waited < 1.0, (fast_waited, slow_waited)


async def test_a_peer_that_never_registers_is_waited_for_only_up_to_the_bound(
        server: MwraServer, run_id: str, caplog: pytest.LogCaptureFixture) -> None:
    async with _client(server) as c:
        await c.register_worker(run_id, "w", cpu_slots=4)

    def trainer() -> tuple[Any, float]:
        alloc = AllocatorClient(server.address, run_id, "alone", threads=1, rollout_budget=8,
                                timeout=10.0, peers=["alone", "absent"], peers_wait_s=0.5)
        try:
            first = alloc.allocation(0), alloc.waited_s
            alloc.allocation(1)  # later rounds do not wait again
            return first[0], alloc.waited_s - first[1]
        finally:
            alloc.close()

    with caplog.at_level("WARNING", logger="mutualrl.trainer.runtime.allocator"):
        (alone, waited_again) = await asyncio.to_thread(trainer)
    assert alone.units == 4
    assert waited_again == 0.0
    assert any("absent not registered with MWRA after 0.5 s" in r.getMessage()
               for r in caplog.records), caplog.text


async def test_a_trainer_waiting_for_its_peers_keeps_its_own_policy_lease(
        redis_url: str, run_id: str) -> None:
    """A wait longer than MWRA's policy lease (4 s here) must not let the waiting policy lapse:
    it would lose its units at the next rebalance."""
    srv = await start_mwra(_cfg(redis_url, run_id, policy_lease_seconds=4.0))
    try:
        async with _client(srv) as c:
            await c.register_worker(run_id, "w", cpu_slots=4)

            def trainer() -> Any:
                alloc = AllocatorClient(srv.address, run_id, "early", threads=1,
                                        rollout_budget=8, timeout=10.0,
                                        peers=["early", "late"], peers_wait_s=30.0)
                try:
                    return alloc.allocation(0)
                finally:
                    alloc.close()

            waiting = asyncio.create_task(asyncio.to_thread(trainer))
            await asyncio.sleep(11.0)  # past two leases, and past the first heartbeat
            (early,) = [p for p in (await c.list_allocations(run_id)).policies]
            assert early.policy_id == "early" and early.live
            assert not waiting.done()
            await c.register_policy(run_id, "late")
            got = await waiting
            assert got.units == 2
    finally:
        await srv.stop(0)


async def test_a_late_registrant_asking_a_follower_is_taken_in_by_the_leader(
        redis_url: str, run_id: str) -> None:
    a = await start_mwra(_cfg(redis_url, run_id, replica_id=f"A-{run_id}"))
    b = await start_mwra(_cfg(redis_url, run_id, replica_id=f"B-{run_id}"))
    try:
        async with _client(a) as ca, _client(b) as cb:
            await ca.register_worker(run_id, "w", cpu_slots=4)
            await ca.register_policy(run_id, "p")
            assert (await ca.get_allocation(run_id, "p", 0)).units == 4  # A plans: A leads
            await asyncio.sleep(0.3)  # B's ticks see the run and find the lock taken
            assert a.coordinator.is_leader(run_id) and not b.coordinator.is_leader(run_id)
            await cb.register_policy(run_id, "late")
            late = await cb.get_allocation(run_id, "late", 0)
            assert late.round == 0 and late.active and late.units == 2 and late.epoch == 2
            assert not b.coordinator.is_leader(run_id)
            assert (await cb.get_allocation(run_id, "p", 0)).units == 2
    finally:
        await b.stop(0)
        await a.stop(0)


async def test_a_late_registrant_gets_a_turn_in_the_current_time_share_round(
        redis_url: str, run_id: str) -> None:
    """time-share took a late policy in only from the next round: it sat the round out, and
    its peers' records of that round never met its own."""
    srv = await start_mwra(_cfg(redis_url, run_id, strategy="time-share", turn_policies=1))
    try:
        async with _client(srv) as c:
            await c.register_worker(run_id, "w", cpu_slots=2)
            for pid in ("p0", "p1"):
                await c.register_policy(run_id, pid)
            first = await c.get_allocation(run_id, "p0", 0)
            assert first.active and first.units == 2 and first.epoch == 1
            await c.register_policy(run_id, "late")
            late = await c.get_allocation(run_id, "late", 0)
            # in the round, its turn after the planned ones; the active turn is unchanged
            assert late.round == 0 and not late.active and late.epoch == 2
            assert (await c.get_allocation(run_id, "p0", 0)).units == 2
            order = []
            for _ in range(3):
                allocs = [await c.get_allocation(run_id, p, 0) for p in ("p0", "p1", "late")]
                active = [a.policy_id for a in allocs if a.active]
                assert len(active) == 1 and all(a.round == 0 for a in allocs), allocs
                assert next(a for a in allocs if a.active).units == 2
                order += active
                await c.report_step_cost(run_id, active[0], 0, 0.5, units=2)
                deadline = time.monotonic() + 5  # the leader's tick hands over the turn
                while time.monotonic() < deadline and len(order) < 3:
                    now = [a for a in (await c.list_allocations(run_id)).allocations
                           if a.active]
                    if now and now[0].policy_id != active[0]:
                        break
                    await asyncio.sleep(0.05)
            assert order == ["p0", "p1", "late"]
            nxt = await c.get_allocation(run_id, "p1", 1)
            assert nxt.round == 1
    finally:
        await srv.stop(0)
