"""Clients of MWRA, the Multi-Worker Resource Allocation service (sync and asyncio).

Every call retries UNAVAILABLE for as long as the options' outage budget
(`ClientOptions.outage_budget`), so a restarting MWRA costs a delay, not a crash;
`watch_allocation` re-opens its stream after UNAVAILABLE within the same budget. A step cost
reported again (a retry after a lost answer) is folded once per round.
Replies are the protobuf messages of `mutualrl.v1.allocation_pb2`.

A trainer's round::

    mwra = MwraClient("mwra:50053", token=token)
    mwra.register_policy(run, "qwen", trainer_id=pod, rollout_budget=64)
    alloc = mwra.get_allocation(run, "qwen", round=k)
    budget = mutualrl.trainer.runtime.allocator.apply_allocation(alloc)  # threads + budget
    ...                                                       # the round
    mwra.report_step_cost(run, "qwen", k, seconds=dt, tokens=n, samples=budget,
                          units=alloc.units)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from mutualrl.client.base import AsyncClient, Client, Target
from mutualrl.client.blocking import LOOP, blocking, blocking_stream
from mutualrl.v1 import allocation_pb2 as pb
from mutualrl.v1 import allocation_pb2_grpc as pb_grpc

DEFAULT_ADDRESS = "127.0.0.1:50053"


def _worker(worker_id: str, cpu_slots: int, gpu_count: int, gpu_kind: str,
            labels: Mapping[str, str] | None, rollout_address: str) -> pb.Worker:
    return pb.Worker(worker_id=worker_id, labels=dict(labels or {}),
                     rollout_address=rollout_address,
                     capacity=pb.WorkerCapacity(cpu_slots=cpu_slots, gpu_count=gpu_count,
                                                gpu_kind=gpu_kind))


class Beats:
    """What a keepalive did so far: the beats it sent and the last error it kept."""

    def __init__(self) -> None:
        self.beats = 0
        self.last_error: Exception | None = None


async def _beat_every(interval: float, beat: Callable[[], Awaitable[object]],
                      tally: Beats | None) -> None:
    tally = tally or Beats()
    while True:
        await asyncio.sleep(interval)
        try:
            await beat()
            tally.beats += 1
        except Exception as err:  # MWRA down for a while: keep trying, a later beat wins
            tally.last_error = err


class AsyncMwraClient(AsyncClient):
    """asyncio client (constructor: `mutualrl.client.base`); `MwraClient` is its blocking
    facade (same methods; watch is an async iterator here)."""

    default_address = DEFAULT_ADDRESS
    service = "MWRA"

    def __init__(self, target: Target = None, **overrides: Any) -> None:
        super().__init__(target, **overrides)
        self.stub = pb_grpc.AllocatorStub(self.channel)

    async def _rpc(self, method: str, request: Any) -> Any:
        return await self._call(getattr(self.stub, method), request)

    async def register_worker(self, run_id: str, worker_id: str, *, cpu_slots: int = 0,
                              gpu_count: int = 0, gpu_kind: str = "",
                              labels: Mapping[str, str] | None = None,
                              rollout_address: str = "") -> pb.Lease:
        worker = _worker(worker_id, cpu_slots, gpu_count, gpu_kind, labels, rollout_address)
        return await self._rpc("RegisterWorker",
                                pb.RegisterWorkerRequest(run_id=run_id, worker=worker))

    async def heartbeat(self, run_id: str, worker_id: str) -> pb.Lease:
        return await self._rpc("Heartbeat",
                                pb.HeartbeatRequest(run_id=run_id, worker_id=worker_id))

    async def deregister_worker(self, run_id: str, worker_id: str) -> bool:
        reply = await self._rpc("DeregisterWorker",
                                 pb.DeregisterWorkerRequest(run_id=run_id, worker_id=worker_id))
        return bool(reply.removed)

    async def keepalive(self, run_id: str, worker_id: str, interval: float,
                        tally: Beats | None = None) -> None:
        """Heartbeat `worker_id` every `interval` seconds forever (run it as a task; cancel it
        to stop). Errors are kept in `tally`, not raised, so a restarting MWRA does not end
        the loop."""
        await _beat_every(interval, lambda: self.heartbeat(run_id, worker_id), tally)

    async def register_policy(self, run_id: str, policy_id: str, *, trainer_id: str = "",
                              min_units: int = 1, weight: float = 1.0,
                              rollout_budget: int = 0,
                              max_rollout_workers: int = 0) -> pb.PolicyInfo:
        return await self._rpc("RegisterPolicy", pb.RegisterPolicyRequest(
            run_id=run_id, policy_id=policy_id, trainer_id=trainer_id, min_units=min_units,
            weight=weight, rollout_budget=rollout_budget,
            max_rollout_workers=max_rollout_workers))

    async def policy_heartbeat(self, run_id: str, policy_id: str) -> pb.PolicyInfo:
        return await self._rpc("PolicyHeartbeat",
                                pb.PolicyHeartbeatRequest(run_id=run_id, policy_id=policy_id))

    async def policy_keepalive(self, run_id: str, policy_id: str, interval: float,
                               tally: Beats | None = None) -> None:
        """PolicyHeartbeat every `interval` seconds forever (for steps longer than the policy
        lease; run it as a task, cancel it to stop); errors are kept in `tally`."""
        await _beat_every(interval, lambda: self.policy_heartbeat(run_id, policy_id), tally)

    async def deregister_policy(self, run_id: str, policy_id: str) -> bool:
        reply = await self._rpc("DeregisterPolicy",
                                 pb.DeregisterPolicyRequest(run_id=run_id, policy_id=policy_id))
        return bool(reply.removed)

    async def report_step_cost(self, run_id: str, policy_id: str, round: int, seconds: float, *,
                               tokens: int = 0, samples: int = 0, units: int = 1,
                               rollout_seconds: float = 0.0, update_seconds: float = 0.0,
                               rollout_units: int = 0) -> pb.PolicyInfo:
        """`rollout_seconds` / `update_seconds`: the round's time generating and updating
        (0 = not measured); `rollout_units`: of `units`, those the rollout workers held."""
        reply = await self._rpc("ReportStepCost", pb.StepCostReport(
            run_id=run_id, policy_id=policy_id, round=round, seconds=seconds, tokens=tokens,
            samples=samples, units=units, rollout_seconds=rollout_seconds,
            update_seconds=update_seconds, rollout_units=rollout_units))
        return reply.policy

    async def get_allocation(self, run_id: str, policy_id: str, round: int) -> pb.Allocation:
        # A follower replica may wait for the leader to plan a new round: allow for it.
        return await self._rpc("GetAllocation", pb.GetAllocationRequest(
            run_id=run_id, policy_id=policy_id, round=round))

    async def watch_allocation(self, run_id: str, policy_id: str) -> AsyncIterator[pb.Allocation]:
        """The current allocation, then every change; re-opens after UNAVAILABLE (MWRA
        restarting) within the outage budget."""
        request = pb.WatchAllocationRequest(run_id=run_id, policy_id=policy_id)
        async for msg in self._stream(lambda: self.stub.WatchAllocation(
                request, metadata=self.options.metadata())):
            yield msg

    async def list_allocations(self, run_id: str) -> pb.AllocationTable:
        return await self._rpc("ListAllocations", pb.ListAllocationsRequest(run_id=run_id))

    async def register_local_worker(self, run_id: str, worker_id: str | None = None,
                                    slots: int | None = None) -> tuple[str, pb.Lease]:
        """Register this machine as a worker with os.cpu_count() CPU slots (local mode)."""
        from mutualrl.client.local_worker import local_worker

        wid, cpu, labels = local_worker(worker_id, slots)
        return wid, await self.register_worker(run_id, wid, cpu_slots=cpu, labels=labels)


class Keepalive(Beats):
    """A blocking client's keepalive: the asyncio client's loop of beats running on the
    clients' loop until `.stop()` (or the end of a `with` block)."""

    def __init__(self, beats: Callable[[Beats], Awaitable[None]]) -> None:
        super().__init__()
        self._future: concurrent.futures.Future[None] = asyncio.run_coroutine_threadsafe(
            _awaited(beats(self)), LOOP.loop())

    def stop(self) -> None:
        self._future.cancel()
        concurrent.futures.wait([self._future], timeout=5)

    def __enter__(self) -> Keepalive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _awaited(aw: Awaitable[None]) -> None:
    await aw


class MwraClient(Client[AsyncMwraClient], core=AsyncMwraClient,
                 stub=pb_grpc.AllocatorStub):
    """Blocking client (constructor: `mutualrl.client.base`): `MwraClient("host:port")` or
    `MwraClient(ClientOptions(...))`; the blocking facade of `AsyncMwraClient`."""

    # workers
    register_worker = blocking(AsyncMwraClient.register_worker)
    heartbeat = blocking(AsyncMwraClient.heartbeat)
    deregister_worker = blocking(AsyncMwraClient.deregister_worker)
    register_local_worker = blocking(AsyncMwraClient.register_local_worker)
    # policies
    register_policy = blocking(AsyncMwraClient.register_policy)
    policy_heartbeat = blocking(AsyncMwraClient.policy_heartbeat)
    deregister_policy = blocking(AsyncMwraClient.deregister_policy)
    report_step_cost = blocking(AsyncMwraClient.report_step_cost)
    # allocations
    get_allocation = blocking(AsyncMwraClient.get_allocation)
    watch_allocation = blocking_stream(AsyncMwraClient.watch_allocation)
    list_allocations = blocking(AsyncMwraClient.list_allocations)

    def keepalive(self, run_id: str, worker_id: str, interval: float) -> Keepalive:
        """Heartbeat `worker_id` every `interval` seconds until `.stop()` (or the end of a
        `with` block)."""
        return Keepalive(lambda tally: self.core.keepalive(run_id, worker_id, interval, tally))

    def policy_keepalive(self, run_id: str, policy_id: str, interval: float) -> Keepalive:
        """PolicyHeartbeat every `interval` seconds (for steps longer than the policy lease)
        until `.stop()` or the end of a `with` block."""
        return Keepalive(lambda tally: self.core.policy_keepalive(run_id, policy_id, interval,
                                                                  tally))
