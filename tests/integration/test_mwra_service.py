"""MWRA against the real Redis and a real server on port 0 (in-process)."""

from __future__ import annotations

import asyncio
import math
import time
import urllib.request
from collections.abc import AsyncIterator

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from mutualrl.client.mwra import AsyncMwraClient, MwraClient
from mutualrl.common.channel import ClientOptions
from mutualrl.mwra.config import MwraConfig
from mutualrl.mwra.server import MwraServer, start_mwra
from mutualrl.mwra.servicer import SERVICE_NAME
from mutualrl.mwra.store import MwraStore
from mutualrl.v1 import allocation_pb2 as pb

pytestmark = pytest.mark.timeout(60)


def _cfg(redis_url: str, **kw: object) -> MwraConfig:
    base: dict[str, object] = {"port": 0, "metrics_port": None, "redis_url": redis_url,
                               "worker_lease_seconds": 5.0, "policy_lease_seconds": 30.0,
                               "lock_ttl_seconds": 1.0, "tick_seconds": 0.05,
                               "watch_poll_seconds": 0.05, "hysteresis": 0.1, "smoothing": 1.0}
    base.update(kw)
    return MwraConfig.model_validate(base)


@pytest.fixture
async def server(redis_url: str) -> AsyncIterator[MwraServer]:
    srv = await start_mwra(_cfg(redis_url))
    yield srv
    await srv.stop(0)


def _client(srv: MwraServer, **kw: object) -> AsyncMwraClient:
    return AsyncMwraClient(ClientOptions(address=srv.address, timeout=10,
                                         backoff_base=0.05, **kw))


async def test_a_round_reported_again_is_folded_once(server: MwraServer, run_id: str) -> None:
    """A client retries ReportStepCost after a lost answer, a resumed trainer redoes a round:
    the round's first report stands, the cost average moves once per round."""
    async with _client(server) as c:
        await c.register_policy(run_id, "p")
        first = await c.report_step_cost(run_id, "p", 0, 2.0, units=1)
        again = await c.report_step_cost(run_id, "p", 0, 8.0, units=1)
        assert (again.reports, again.smoothed_cost) == (first.reports, first.smoothed_cost) \
            == (1, pytest.approx(2.0))
        later = await c.report_step_cost(run_id, "p", 1, 4.0, units=1)
        assert later.reports == 2 and later.last_round == 1


async def test_register_report_and_balanced_rebalance_between_rounds(server: MwraServer,
                                                                     run_id: str) -> None:
    async with _client(server) as c:
        lease = await c.register_worker(run_id, "w0", cpu_slots=8, labels={"zone": "a"})
        assert lease.worker_id == "w0" and lease.lease_seconds == 5.0
        assert lease.expires_unix_ms > time.time() * 1000
        for pid in ("slow", "fast"):
            info = await c.register_policy(run_id, pid, trainer_id=f"t-{pid}", rollout_budget=32)
            assert info.live and info.min_units == 1 and info.weight == 1.0
        a0 = await c.get_allocation(run_id, "slow", 0)
        b0 = await c.get_allocation(run_id, "fast", 0)
        # nobody reported yet: equal costs -> equal split of the 8 CPU threads
        assert (a0.units, b0.units, a0.threads, b0.threads) == (4, 4, 4, 4)
        assert a0.round == 0 and a0.epoch == 1 and a0.strategy == "balanced" and a0.active
        assert a0.rollout_budget == 32 and list(a0.worker_ids) == ["w0"] and a0.pool_units == 8
        # step costs 3:1 (seconds * units): slow 3 s on 4 units, fast 1 s on 4 units
        info = await c.report_step_cost(run_id, "slow", 0, 3.0, tokens=100, samples=32, units=4)
        assert info.smoothed_cost == pytest.approx(12.0) and info.reports == 1
        await c.report_step_cost(run_id, "fast", 0, 1.0, tokens=50, samples=32, units=4)
        # the allocation of round 0 is fixed once asked: costs do not change it mid-round
        again = await c.get_allocation(run_id, "fast", 0)
        assert again == b0
        a1 = await c.get_allocation(run_id, "slow", 1)
        b1 = await c.get_allocation(run_id, "fast", 1)
        assert (a1.units, b1.units) == (6, 2) and a1.epoch == b1.epoch == 2 and a1.round == 1
        # a lagging policy asking for an older round gets the plan in force
        assert (await c.get_allocation(run_id, "fast", 0)).round == 1
        table = await c.list_allocations(run_id)
        assert table.epoch == 2 and table.round == 1 and table.idle_units == 0
        assert table.pool_units == 8 and table.leader == server.coordinator.replica
        assert [w.units_by_policy["slow"] for w in table.workers] == [6]
        assert table.workers[0].holder == "fast,slow" and table.workers[0].state == "live"
        assert table.workers[0].worker.labels["zone"] == "a"


async def test_a_finished_policy_hands_its_threads_to_the_one_still_training(
        server: MwraServer, run_id: str) -> None:
    """A fast trainer runs all its rounds while a slow one is still in round 1, then
    deregisters (the trainer's `leave` at its end): the slow one's next allocation, of a
    round long behind the plan's, holds the whole pool, and so does the table."""
    async with _client(server) as c:
        await c.register_worker(run_id, "w", cpu_slots=4)
        for pid in ("fast", "slow"):
            await c.register_policy(run_id, pid, rollout_budget=16)
        slow0 = await c.get_allocation(run_id, "slow", 0)
        for r in range(6):
            fast = await c.get_allocation(run_id, "fast", r)
            assert (fast.round, fast.threads) == (r, 2)
            await c.report_step_cost(run_id, "fast", r, 0.1, units=fast.units)
        assert (slow0.threads, slow0.units) == (2, 2)
        await c.report_step_cost(run_id, "slow", 0, 5.0, units=2)
        # still training: the plan of round 5 keeps the slow policy at its share
        held = await c.get_allocation(run_id, "slow", 1)
        assert (held.round, held.threads) == (5, 2)
        assert await c.deregister_policy(run_id, "fast")
        slow1 = await c.get_allocation(run_id, "slow", 1)
        assert (slow1.threads, slow1.units, slow1.pool_units) == (4, 4, 4)
        assert slow1.epoch > held.epoch and slow1.round == 5 and slow1.active
        table = await c.list_allocations(run_id)
        assert {a.policy_id: a.units for a in table.allocations} == {"slow": 4}
        assert table.workers[0].holder == "slow" and table.idle_units == 0
        # the slow policy's later rounds keep the pool
        for r in (2, 6):
            assert (await c.get_allocation(run_id, "slow", r)).threads == 4


async def test_worker_that_stops_heartbeating_is_reassigned_within_one_lease(
        redis_url: str, run_id: str) -> None:
    lease_s = 0.5
    srv = await start_mwra(_cfg(redis_url, worker_lease_seconds=lease_s))
    try:
        async with _client(srv) as c:
            await c.register_worker(run_id, "w1", cpu_slots=2)
            await c.register_worker(run_id, "w2", cpu_slots=2)
            for pid in ("a", "b"):
                await c.register_policy(run_id, pid)
            keep = asyncio.create_task(c.keepalive(run_id, "w1", lease_s / 5))
            r = 0
            alloc = {p: await c.get_allocation(run_id, p, r) for p in ("a", "b")}
            assert sum(a.units for a in alloc.values()) == 4
            assert {w for a in alloc.values() for w in a.worker_ids} == {"w1", "w2"}
            last_beat = time.monotonic()
            await c.heartbeat(run_id, "w2")  # its last heartbeat
            # trainers run short rounds; w2 must stay until its lease lapses, then go
            while True:
                r += 1
                alloc = {p: await c.get_allocation(run_id, p, r) for p in ("a", "b")}
                held = {w for a in alloc.values() for w in a.worker_ids}
                elapsed = time.monotonic() - last_beat
                if "w2" not in held:
                    break
                assert elapsed < lease_s + 0.5, "w2 still held well past its lease"
                await asyncio.sleep(0.05)
            print(f"w2 reassigned {elapsed:.3f}s after its last heartbeat (lease {lease_s}s)")
            assert elapsed >= lease_s * 0.9  # not before the lease lapsed (ms clock rounding)
            assert elapsed < lease_s + 0.5
            assert sum(a.units for a in alloc.values()) == 2  # the live pool: w1 only
            assert all(a.units == 1 and list(a.worker_ids) == ["w1"] for a in alloc.values())
            table = await c.list_allocations(run_id)
            states = {w.worker.worker_id: w.state for w in table.workers}
            assert states == {"w1": "live", "w2": "lost"}
            await asyncio.sleep(0.2)  # a few leader ticks: the reaper counts the loss once
            lost = REGISTRY.get_sample_value("mutualrl_mwra_lost_workers_total", {"run": run_id})
            assert lost == 1.0
            # it comes back: a heartbeat revives it and the next round uses it again
            await c.heartbeat(run_id, "w2")
            back = await c.get_allocation(run_id, "a", r + 1)
            assert back.pool_units == 4
            keep.cancel()
    finally:
        await srv.stop(0)


async def test_trainer_that_never_reports_does_not_block_others_and_is_released(
        redis_url: str, run_id: str) -> None:
    policy_lease = 0.6
    srv = await start_mwra(_cfg(redis_url, policy_lease_seconds=policy_lease,
                                worker_lease_seconds=30.0))
    try:
        async with _client(srv) as c:
            await c.register_worker(run_id, "w", cpu_slots=6)
            for pid in ("a", "b", "silent", "longstep"):
                await c.register_policy(run_id, pid)
            # a trainer in one long step reports nothing but heartbeats: it stays live
            beat = asyncio.create_task(c.policy_keepalive(run_id, "longstep", 0.1))
            start = time.monotonic()
            first = await c.get_allocation(run_id, "a", 0)
            assert first.units == 2  # four live policies share 6 units: 2/2/1/1 (ids break ties)
            r = 0
            units: dict[str, int] = {}
            while time.monotonic() - start < policy_lease + 0.6:
                r += 1
                t0 = time.monotonic()
                for pid, secs in (("a", 0.02), ("b", 0.02)):
                    alloc = await c.get_allocation(run_id, pid, r)
                    units[pid] = alloc.units
                    await c.report_step_cost(run_id, pid, r, secs, units=max(alloc.units, 1))
                assert time.monotonic() - t0 < 1.0  # never waits for the silent trainer
                await asyncio.sleep(0.05)
            beat.cancel()
            assert r >= 5
            # the silent policy's lease lapsed: its units went to the others
            assert units == {"a": 2, "b": 2}
            table = await c.list_allocations(run_id)
            live = {p.policy_id: p.live for p in table.policies}
            assert live == {"a": True, "b": True, "silent": False, "longstep": True}
            held = {a.policy_id: a.units for a in table.allocations}
            assert held == {"a": 2, "b": 2, "silent": 0, "longstep": 2}
            silent = next(a for a in table.allocations if a.policy_id == "silent")
            assert silent.units == 0 and not silent.active and silent.rollout_budget == 0
    finally:
        await srv.stop(0)


async def _expect(code: grpc.StatusCode, field: str, coro: object) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await coro  # type: ignore[misc]
    assert err.value.code() == code, err.value.details()
    assert field in (err.value.details() or ""), err.value.details()


async def test_bad_input_is_rejected_naming_the_field_and_server_keeps_serving(
        server: MwraServer, run_id: str) -> None:
    inv, nf = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
    async with _client(server) as c:
        await c.register_worker(run_id, "w", cpu_slots=4)
        await c.register_policy(run_id, "p")
        await _expect(inv, "seconds", c.report_step_cost(run_id, "p", 0, -1.0))
        await _expect(inv, "seconds", c.report_step_cost(run_id, "p", 0, math.nan))
        await _expect(inv, "seconds", c.report_step_cost(run_id, "p", 0, math.inf))
        await _expect(inv, "seconds", c.report_step_cost(run_id, "p", 0, 0.0))
        await _expect(inv, "tokens", c.report_step_cost(run_id, "p", 0, 1.0, tokens=-5))
        await _expect(inv, "samples", c.report_step_cost(run_id, "p", 0, 1.0, samples=-1))
        await _expect(inv, "units", c.report_step_cost(run_id, "p", 0, 1.0, units=0))
        await _expect(inv, "round", c.report_step_cost(run_id, "p", -1, 1.0))
        await _expect(nf, "policy_id", c.report_step_cost(run_id, "ghost", 0, 1.0))
        await _expect(nf, "policy_id", c.get_allocation(run_id, "ghost", 0))
        await _expect(inv, "round", c.get_allocation(run_id, "p", -3))
        await _expect(nf, "worker_id", c.heartbeat(run_id, "ghost"))
        await _expect(nf, "policy_id", c.policy_heartbeat(run_id, "ghost"))
        await _expect(inv, "worker.capacity", c.register_worker(run_id, "z", cpu_slots=0))
        await _expect(inv, "worker.capacity.cpu_slots",
                      c.register_worker(run_id, "z", cpu_slots=-2))
        await _expect(inv, "worker.worker_id", c.register_worker(run_id, "bad id!", cpu_slots=1))
        await _expect(inv, "worker.rollout_address",
                      c.register_worker(run_id, "z", cpu_slots=1, rollout_address="nope"))
        await _expect(inv, "run_id", c.register_worker("", "z", cpu_slots=1))
        await _expect(inv, "run_id", c.get_allocation("run{x}", "p", 0))
        await _expect(inv, "weight", c.register_policy(run_id, "q", weight=-1.0))
        await _expect(inv, "weight", c.register_policy(run_id, "q", weight=math.nan))
        await _expect(inv, "min_units", c.register_policy(run_id, "q", min_units=-1))
        await _expect(inv, "rollout_budget", c.register_policy(run_id, "q", rollout_budget=-1))
        await _expect(nf, "run_id", c.list_allocations("no-such-run-" + run_id))
        # still serving, and nothing bad was stored
        alloc = await c.get_allocation(run_id, "p", 0)
        assert alloc.units == 4 and alloc.active
        table = await c.list_allocations(run_id)
        assert [w.worker.worker_id for w in table.workers] == ["w"]
        assert [p.policy_id for p in table.policies] == ["p"] and table.policies[0].reports == 0


async def test_cpu_pool_shorter_than_policies_is_shared_every_round(redis_url: str,
                                                                    run_id: str) -> None:
    """The default for CPU units: three policies on two threads all train every round with a
    thread each (nobody waits for a turn)."""
    srv = await start_mwra(_cfg(redis_url, strategy="balanced"))
    try:
        async with _client(srv) as c:
            await c.register_worker(run_id, "w", cpu_slots=2)
            ids = ["p0", "p1", "p2"]
            for pid in ids:
                await c.register_policy(run_id, pid, rollout_budget=8)
            for r in range(3):
                allocs = [await c.get_allocation(run_id, p, r) for p in ids]
                assert all(a.active and a.strategy == "shared" for a in allocs)
                assert [(a.threads, a.units, a.rollout_budget) for a in allocs] == [(1, 1, 8)] * 3
                assert all(list(a.worker_ids) == ["w"] for a in allocs)
            table = await c.list_allocations(run_id)
            assert table.strategy == "shared" and table.idle_units == 0
    finally:
        await srv.stop(0)


async def test_time_share_when_fewer_units_than_policies(redis_url: str, run_id: str) -> None:
    """Five policies on two units taking turns *within* each round: a turn is active until its
    policies report the round, then the next turn; the next round waits for the last turn.
    Every policy trains every round, and who goes first rotates."""
    srv = await start_mwra(_cfg(redis_url, strategy="static", short_pool="time-share"))
    try:
        async with _client(srv) as c:
            await c.register_worker(run_id, "w", cpu_slots=2)
            ids = ["p0", "p1", "p2", "p3", "p4"]
            for pid in ids:
                await c.register_policy(run_id, pid, rollout_budget=8)
            firsts = []
            for r in range(3):
                trained: list[str] = []
                for turn in range(3):
                    allocs = [await c.get_allocation(run_id, p, r) for p in ids]
                    active = [a.policy_id for a in allocs if a.active]
                    assert active and len(active) <= 2, (r, turn, active)
                    assert all(a.strategy == "time-share" for a in allocs)
                    assert sum(a.units for a in allocs) == 2
                    for a in allocs:
                        assert a.rollout_budget == (8 if a.active else 0)
                        assert a.threads == (a.units if a.active else 0)
                    if turn == 0:
                        firsts.append(active)
                        # a policy done with round r asking for r + 1 waits: turns remain
                        ahead = await c.get_allocation(run_id, active[0], r + 1)
                        assert not ahead.active and ahead.round == r
                    assert not set(active) & set(trained)
                    for pid in active:
                        await c.report_step_cost(run_id, pid, r, 0.5, units=1)
                    trained += active
                assert sorted(trained) == ids, (r, trained)
            assert firsts == [["p0", "p1"], ["p2", "p3"], ["p0", "p4"]]
    finally:
        await srv.stop(0)


async def test_watch_allocation_streams_changes(server: MwraServer, run_id: str) -> None:
    async with _client(server) as c:
        await c.register_worker(run_id, "w", cpu_slots=8)
        await c.register_policy(run_id, "a")
        await c.register_policy(run_id, "b")
        await c.get_allocation(run_id, "a", 0)
        stream = c.watch_allocation(run_id, "a")
        first = await asyncio.wait_for(stream.__anext__(), 5)
        assert (first.round, first.units) == (0, 4)
        await c.report_step_cost(run_id, "a", 0, 3.0, units=4)
        await c.report_step_cost(run_id, "b", 0, 1.0, units=4)
        await c.get_allocation(run_id, "b", 1)  # b moves the run to round 1
        second = await asyncio.wait_for(stream.__anext__(), 5)
        assert (second.round, second.units, second.epoch) == (1, 6, 2)
        await stream.aclose()


async def test_auth_health_reflection_metrics_and_sync_client(redis_url: str,
                                                              run_id: str) -> None:
    srv = await start_mwra(_cfg(redis_url, auth_token="s3cret", metrics_port=0))
    try:
        async with grpc.aio.insecure_channel(srv.address) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            reply = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        async with _client(srv) as anon:
            await _expect(grpc.StatusCode.UNAUTHENTICATED, "bearer",
                          anon.register_worker(run_id, "w", cpu_slots=2))

        def sync_flow() -> tuple[pb.Allocation, pb.AllocationTable]:
            with MwraClient(srv.address, token="s3cret", timeout=10) as c:
                wid, lease = c.register_local_worker(run_id, slots=3)
                assert wid.startswith("local-") and lease.worker_id == wid
                c.register_policy(run_id, "solo", rollout_budget=5)
                alloc = c.get_allocation(run_id, "solo", 0)
                with c.keepalive(run_id, wid, 0.05) as ka:
                    time.sleep(0.3)
                assert ka.beats >= 2 and ka.last_error is None
                return alloc, c.list_allocations(run_id)

        alloc, table = await asyncio.to_thread(sync_flow)
        assert (alloc.units, alloc.threads, alloc.rollout_budget) == (3, 3, 5)
        assert table.workers[0].worker.capacity.cpu_slots == 3
        assert srv.grpc.metrics_port is not None
        body = await asyncio.to_thread(
            lambda: urllib.request.urlopen(
                f"http://127.0.0.1:{srv.grpc.metrics_port}/metrics", timeout=5).read().decode())
        assert f'mutualrl_mwra_allocated_units{{policy="solo",run="{run_id}"}} 3.0' in body
        assert f'mutualrl_mwra_idle_units{{run="{run_id}"}} 0.0' in body
        assert f'mutualrl_mwra_rebalances_total{{run="{run_id}"}} 1.0' in body
        assert "mutualrl_mwra_lost_workers_total" in body or "mutualrl_mwra_lost_workers" in body
    finally:
        await srv.stop(0)


async def test_two_replicas_one_leads_the_other_takes_over(redis_url: str, run_id: str) -> None:
    a = await start_mwra(_cfg(redis_url, replica_id=f"A-{run_id}"))
    b = await start_mwra(_cfg(redis_url, replica_id=f"B-{run_id}"))
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        async with _client(a) as ca, _client(b) as cb:
            await ca.register_worker(run_id, "w", cpu_slots=4)
            await ca.register_policy(run_id, "p")
            await cb.register_policy(run_id, "q")
            first = await ca.get_allocation(run_id, "p", 0)  # A plans round 0: A leads
            assert first.units == 2
            await asyncio.sleep(0.3)  # several ticks: B sees the run and tries the lock
            assert a.coordinator.is_leader(run_id) and not b.coordinator.is_leader(run_id)
            assert r.get(f"mrl:mwra:{{{run_id}}}:leader") == f"A-{run_id}"
            # a follower serves reads from Redis, and forwards a new round to the leader
            same = await cb.get_allocation(run_id, "p", 0)
            assert same == first
            nxt = await cb.get_allocation(run_id, "q", 1)
            assert nxt.round == 1 and nxt.units == 2
            assert not b.coordinator.is_leader(run_id)
            # A dies without releasing its lock (stop serving and kill its loop)
            await a.coordinator.stop_background()
            await a.grpc.server.stop(0)  # no graceful stop: its close hooks would release the lock
            assert r.get(f"mrl:mwra:{{{run_id}}}:leader") == f"A-{run_id}"  # not released
            t0 = time.monotonic()
            while not b.coordinator.is_leader(run_id):
                assert time.monotonic() - t0 < 3.0, "B never took over"
                await asyncio.sleep(0.05)
            took = time.monotonic() - t0
            print(f"B took over {took:.2f}s after A died (lock TTL 1.0s)")
            assert r.get(f"mrl:mwra:{{{run_id}}}:leader") == f"B-{run_id}"
            await cb.report_step_cost(run_id, "p", 1, 3.0, units=2)
            await cb.report_step_cost(run_id, "q", 1, 1.0, units=2)
            after = await cb.get_allocation(run_id, "p", 2)  # B plans round 2
            assert after.round == 2 and after.units == 3 and after.epoch == first.epoch + 1
    finally:
        r.close()
        await b.stop(0)
        await a.stop(0)


async def test_inspect_allocation_cli(server: MwraServer, run_id: str,
                                      capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from mutualrl.cli import main

    monkeypatch.setenv("COLUMNS", "220")
    async with _client(server) as c:
        await c.register_worker(run_id, "node-a", cpu_slots=2, gpu_count=2, gpu_kind="H200",
                                rollout_address="10.1.1.1:30000")
        await c.register_policy(run_id, "llama", trainer_id="pod-1", rollout_budget=16)
        await c.register_policy(run_id, "qwen", trainer_id="pod-2", rollout_budget=16)
        await c.get_allocation(run_id, "llama", 0)
    rc = await asyncio.to_thread(main, ["inspect", "allocation", "--run", run_id, "--addr",
                                        server.address, "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    units = {a["policy_id"]: a["units"] for a in data["allocations"]}
    assert units == {"llama": 1, "qwen": 1} and data["strategy"] == "balanced"
    assert data["workers"][0]["units_by_policy"] == {"llama": 1, "qwen": 1}
    rc = await asyncio.to_thread(main, ["inspect", "allocation", "--run", run_id, "--addr",
                                        server.address])
    text = capsys.readouterr().out
    assert rc == 0
    for needle in ("llama", "qwen", "pod-1", "node-a", "10.1.1.1:30000", "H200", "live",
                   "node-a:1", "llama:1, qwen:1"):
        assert needle in text, needle
    rc = await asyncio.to_thread(main, ["inspect", "allocation", "--run", "nope-" + run_id,
                                        "--addr", server.address])
    assert rc == 1 and "NOT_FOUND" in capsys.readouterr().err



async def test_unreachable_redis_is_unavailable_and_server_recovers(server: MwraServer,
                                                                    run_id: str) -> None:
    async with _client(server) as c:
        await c.register_worker(run_id, "w", cpu_slots=2)
        await c.register_policy(run_id, "p")
        good = server.coordinator.store
        server.coordinator.store = MwraStore.from_url("redis://127.0.0.1:1/0", timeout=0.5)
        try:
            no_retry = AsyncMwraClient(ClientOptions(address=server.address, outage_budget=0))
            await _expect(grpc.StatusCode.UNAVAILABLE, "redis",
                          no_retry.get_allocation(run_id, "p", 0))
            await no_retry.close()
        finally:
            await server.coordinator.store.close()
            server.coordinator.store = good
        alloc = await c.get_allocation(run_id, "p", 0)  # Redis back: serving as before
        assert alloc.units == 2


async def test_declared_policies_share_round_zero_whichever_trainer_asks_first(
        server: MwraServer, run_id: str) -> None:
    """The launchers declare a run's policies before its trainers start: the first trainer to
    ask for round 0 gets its one slot of three, not the whole pool (as `solo` above does)."""
    from mutualrl.launch.up import declare_policies

    def flow() -> tuple[pb.Allocation, pb.Allocation]:
        with MwraClient(server.address, timeout=10) as c:
            c.register_local_worker(run_id, slots=3)
            declare_policies(c, run_id, ["a", "b", "c"])
            # "c"'s trainer starts first and registers again, with its id and budget
            c.register_policy(run_id, "c", trainer_id="c-1", rollout_budget=64)
            first = c.get_allocation(run_id, "c", 0)
            c.register_policy(run_id, "a", trainer_id="a-1", rollout_budget=32)
            return first, c.get_allocation(run_id, "a", 0)

    first, later = await asyncio.to_thread(flow)
    assert (first.units, first.threads, first.rollout_budget) == (1, 1, 64)
    assert (later.units, later.threads, later.rollout_budget, later.epoch) == (1, 1, 32,
                                                                              first.epoch)
