"""The MWRA gRPC servicer: a thin shell over the coordinator (`coordinator.py`).

Each RPC validates its request (`requests.py`: INVALID_ARGUMENT / NOT_FOUND naming the field),
writes facts to Redis (`MwraStore`) and asks the coordinator for the plan in force, which it
makes, as the run's leader, from the pure core (`mutualrl.mwra.allocation.plan_round`) when a
policy asks for a round past the current plan's round.

What a run holds is bounded (`max_workers`, `max_policies`, labels and addresses by size), so
every answer fits the message limit by construction (`config.table_bound`), and a round a
request names lies within `max_round_ahead` of the run's current round (`_check_round`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Protocol

import grpc

from mutualrl.common import bounds, ids
from mutualrl.common.errors import NotFound, ResourceExhausted, quote
from mutualrl.common.redis_errors import redis_rpc
from mutualrl.mwra.allocation import PoolAssignment
from mutualrl.mwra.config import MwraConfig
from mutualrl.mwra.coordinator import Coordinator
from mutualrl.mwra.metrics import COST
from mutualrl.mwra.requests import check_cost, check_id, check_policy, check_worker
from mutualrl.mwra.store import MwraStore, PolicyRecord, RunState, WorkerRecord, now_ms
from mutualrl.v1 import allocation_pb2 as pb
from mutualrl.v1 import allocation_pb2_grpc as pb_grpc
from mutualrl.v1 import runs_pb2 as runs_pb

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Allocator"].full_name


class _PolicyRequest(Protocol):
    run_id: str
    policy_id: str


class _WorkerRequest(Protocol):
    run_id: str
    worker_id: str


def _policy_ids(request: _PolicyRequest) -> tuple[str, str]:
    return ids.check_run_id(request.run_id), check_id("policy_id", request.policy_id)


def _worker_ids(request: _WorkerRequest) -> tuple[str, str]:
    return ids.check_run_id(request.run_id), check_id("worker_id", request.worker_id)


def _allocation(run_id: str, policy_id: str, plan: PoolAssignment | None,
                budget: int) -> pb.Allocation:
    if plan is None:
        return pb.Allocation(run_id=run_id, policy_id=policy_id, round=-1)
    slices = [pb.WorkerSlice(worker_id=w, units=u, rollout_address=plan.rollout.get(w, ""))
              for w, u in plan.placement.get(policy_id, {}).items()]
    active = policy_id in plan.active and plan.units.get(policy_id, 0) > 0
    return pb.Allocation(
        run_id=run_id, policy_id=policy_id, epoch=plan.epoch, round=plan.round,
        worker_ids=[s.worker_id for s in slices], units=plan.units.get(policy_id, 0),
        threads=plan.threads.get(policy_id, 0), rollout_budget=budget if active else 0,
        active=active, strategy=plan.strategy,
        rollout_addresses=[s.rollout_address for s in slices if s.rollout_address],
        slices=slices, pool_units=plan.pool_units,
        rollout_workers=plan.rollout_workers.get(policy_id, 0) if active else 0,
        rollout_threads=plan.rollout_threads.get(policy_id, 0) if active else 0,
        rollout_units=plan.rollout_units.get(policy_id, 0) if active else 0)


class AllocatorService(pb_grpc.AllocatorServicer):
    """Serves one or more runs from Redis; the coordinator leads them."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self.cfg: MwraConfig = coordinator.cfg

    @property
    def store(self) -> MwraStore:
        return self.coordinator.store

    # the openings --------------------------------------------------------------------------
    async def _touch(self, run: str, pid: str) -> None:
        """A registered policy showed a sign of life (NOT_FOUND when it is not registered):
        the run is ticked from now on."""
        if not await self.store.touch_policy(run, pid):
            raise NotFound("policy_id",
                           f"policy {quote(pid)} is not registered in run {quote(run)}")
        self.coordinator.track(run)

    async def _check_round(self, run: str, round_: int) -> None:
        """`round_` within `max_round_ahead` of the run's current round: the round of its plan
        or the latest round a policy reported, whichever is later (none: any first round)."""
        bounds.check_int(round_, "round", bounds.MAX_ROUND)
        state = await self.store.load(run)
        known = [state.plan.round] if state.plan is not None else []
        known += [c.last_round for c in state.costs.values()]
        current = max(known, default=-1)
        bounds.check_round(round_, "round", current if current >= 0 else None,
                           self.cfg.max_round_ahead)

    async def _info(self, run: str, pid: str) -> pb.PolicyInfo:
        return self._policy_info(run, await self.store.load(run), pid, now_ms())

    # conversions ---------------------------------------------------------------------------
    def _policy_info(self, run_id: str, state: RunState, pid: str, now: int) -> pb.PolicyInfo:
        rec = state.policies[pid]
        cost = state.costs.get(pid)
        seen = state.seen.get(pid, 0)
        info = pb.PolicyInfo(
            run_id=run_id, policy_id=pid, trainer_id=rec.trainer_id,
            live=seen > now - int(self.cfg.policy_lease_seconds * 1000), last_seen_unix_ms=seen,
            min_units=rec.min_units, weight=rec.weight, rollout_budget=rec.rollout_budget,
            max_rollout_workers=rec.max_rollout_workers)
        if cost is not None:
            info.smoothed_cost = cost.smoothed or 0.0
            info.reports = cost.reports
            info.last_seconds, info.last_tokens = cost.last_seconds, cost.last_tokens
            info.last_samples, info.last_units = cost.last_samples, cost.last_units
            info.last_round = cost.last_round
            info.smoothed_rollout_cost = cost.rollout or 0.0
            info.smoothed_update_cost = cost.update or 0.0
            info.last_rollout_seconds = cost.last_rollout_seconds
            info.last_update_seconds = cost.last_update_seconds
        return info

    def _lease(self, worker_id: str, expires: int) -> pb.Lease:
        return pb.Lease(worker_id=worker_id, lease_seconds=self.cfg.worker_lease_seconds,
                        expires_unix_ms=expires)

    # RPCs ----------------------------------------------------------------------------------
    @redis_rpc
    async def RegisterWorker(self, request: pb.RegisterWorkerRequest,
                             context: grpc.aio.ServicerContext) -> pb.Lease:
        run = ids.check_run_id(request.run_id)
        wid = check_worker(request, self.cfg)
        if not await self.store.has_room(run, "workers", wid, self.cfg.max_workers):
            raise ResourceExhausted("worker.worker_id", f"run {quote(run)} holds "
                                    f"{self.cfg.max_workers} workers, the limit (max_workers); "
                                    "deregister one first")
        w, cap = request.worker, request.worker.capacity
        rec = WorkerRecord(worker_id=wid, cpu_slots=cap.cpu_slots, gpu_count=cap.gpu_count,
                           gpu_kind=cap.gpu_kind, labels=dict(w.labels),
                           rollout_address=w.rollout_address, registered_ms=now_ms())
        expires = await self.store.put_worker(run, rec, self.cfg.worker_lease_seconds)
        self.coordinator.track(run)
        log.info("run %s: worker %s registered (cpu %d, gpu %d %s)", run, wid, cap.cpu_slots,
                 cap.gpu_count, cap.gpu_kind)
        return self._lease(wid, expires)

    @redis_rpc
    async def Heartbeat(self, request: pb.HeartbeatRequest,
                        context: grpc.aio.ServicerContext) -> pb.Lease:
        run, wid = _worker_ids(request)
        renewed = await self.store.renew_lease(run, wid, self.cfg.worker_lease_seconds)
        if renewed is None:
            raise NotFound("worker_id",
                           f"worker {quote(wid)} is not registered in run {quote(run)}")
        self.coordinator.track(run)
        expires, revived = renewed
        if revived:
            log.info("run %s: worker %s is back; it rejoins the pool at the next rebalance",
                     run, wid)
        return self._lease(wid, expires)

    @redis_rpc
    async def RegisterPolicy(self, request: pb.RegisterPolicyRequest,
                             context: grpc.aio.ServicerContext) -> pb.PolicyInfo:
        run, pid = _policy_ids(request)
        weight = check_policy(request, self.cfg)
        if not await self.store.has_room(run, "policies", pid, self.cfg.max_policies):
            raise ResourceExhausted("policy_id", f"run {quote(run)} holds "
                                    f"{self.cfg.max_policies} policies, the limit "
                                    "(max_policies); deregister one first")
        rec = PolicyRecord(policy_id=pid, trainer_id=request.trainer_id,
                           min_units=request.min_units or 1, weight=weight,
                           rollout_budget=request.rollout_budget, registered_ms=now_ms(),
                           max_rollout_workers=request.max_rollout_workers)
        await self.store.put_policy(run, rec)
        self.coordinator.track(run)
        log.info("run %s: policy %s registered (trainer %s)", run, pid, rec.trainer_id or "-")
        return await self._info(run, pid)

    @redis_rpc
    async def PolicyHeartbeat(self, request: pb.PolicyHeartbeatRequest,
                              context: grpc.aio.ServicerContext) -> pb.PolicyInfo:
        run, pid = _policy_ids(request)
        await self._touch(run, pid)
        return await self._info(run, pid)

    @redis_rpc
    async def ReportStepCost(self, request: pb.StepCostReport,
                             context: grpc.aio.ServicerContext) -> pb.StepCostAck:
        run, pid = _policy_ids(request)
        seconds = check_cost(request, self.cfg)
        await self._check_round(run, request.round)
        await self._touch(run, pid)
        await self.store.record_cost(run, pid, round_=request.round, seconds=seconds,
                                     tokens=request.tokens, samples=request.samples,
                                     units=request.units, alpha=self.cfg.smoothing,
                                     rollout_seconds=request.rollout_seconds,
                                     update_seconds=request.update_seconds,
                                     rollout_units=request.rollout_units)
        plan, _ = await self.store.load_plan(run)
        if plan is not None and plan.strategy == "time-share" and pid in plan.active:
            await self.coordinator.next_turn(run)
        state = await self.store.load(run)
        cost = state.costs[pid].smoothed
        if cost is not None:
            COST.labels(run, pid).set(cost)
        return pb.StepCostAck(policy=self._policy_info(run, state, pid, now_ms()))

    @redis_rpc
    async def GetAllocation(self, request: pb.GetAllocationRequest,
                            context: grpc.aio.ServicerContext) -> pb.Allocation:
        run, pid = _policy_ids(request)
        await self._check_round(run, request.round)
        await self._touch(run, pid)
        plan = await self.coordinator.plan_for(run, pid, request.round)
        state = await self.store.load(run)
        rec = state.policies.get(pid)
        if rec is None:
            raise NotFound("policy_id", f"policy {quote(pid)} was deregistered")
        alloc = _allocation(run, pid, plan, rec.rollout_budget)
        if plan is not None and plan.strategy == "time-share" and plan.round < request.round:
            # Turns of an earlier round still train: this round's turn has not come yet.
            alloc.active, alloc.rollout_budget, alloc.threads = False, 0, 0
            alloc.rollout_workers, alloc.rollout_threads, alloc.rollout_units = 0, 0, 0
        return alloc

    @redis_rpc
    async def WatchAllocation(self, request: pb.WatchAllocationRequest,
                              context: grpc.aio.ServicerContext) -> AsyncIterator[pb.Allocation]:
        run, pid = _policy_ids(request)
        last: bytes | None = None
        # context.done(): stop polling once the client went away, even if the cancellation of
        # this handler was swallowed inside a Redis call.
        while not context.done():
            state = await self.store.load(run)
            rec = state.policies.get(pid)
            if rec is None:
                raise NotFound("policy_id",
                               f"policy {quote(pid)} is not registered in run {quote(run)}")
            msg = _allocation(run, pid, state.plan, rec.rollout_budget)
            blob = msg.SerializeToString(deterministic=True)
            if blob != last:
                last = blob
                yield msg
            await asyncio.sleep(self.cfg.watch_poll_seconds)

    @redis_rpc
    async def ListAllocations(self, request: pb.ListAllocationsRequest,
                              context: grpc.aio.ServicerContext) -> pb.AllocationTable:
        run = ids.check_run_id(request.run_id)
        state = await self.store.load(run)
        if not state.workers and not state.policies:
            raise NotFound("run_id", f"run {quote(run)} has no workers or policies")
        now = now_ms()
        plan = state.plan
        table = pb.AllocationTable(run_id=run, leader=state.leader or "", round=-1)
        if plan is not None:
            table.epoch, table.round, table.strategy = plan.epoch, plan.round, plan.strategy
            table.idle_units, table.pool_units = plan.idle_units, plan.pool_units
        for pid in sorted(state.policies):
            table.policies.append(self._policy_info(run, state, pid, now))
            table.allocations.append(_allocation(run, pid, plan,
                                                 state.policies[pid].rollout_budget))
        pool = {w.worker_id: w.units for w in self.coordinator.pool(state, now)[0]}
        for wid in sorted(state.workers):
            rec = state.workers[wid]
            held = {p: ws[wid] for p, ws in (plan.placement if plan else {}).items() if wid in ws}
            expires = state.leases.get(wid, 0)
            table.workers.append(pb.WorkerState(
                worker=pb.Worker(worker_id=wid, labels=rec.labels,
                                 rollout_address=rec.rollout_address,
                                 capacity=pb.WorkerCapacity(cpu_slots=rec.cpu_slots,
                                                            gpu_count=rec.gpu_count,
                                                            gpu_kind=rec.gpu_kind)),
                lease=self._lease(wid, expires),
                state="live" if expires > now else "lost", holder=",".join(sorted(held)),
                units_by_policy=held, units=pool.get(wid, 0)))
        return table

    # removals ------------------------------------------------------------------------------
    @redis_rpc
    async def DeregisterWorker(self, request: pb.DeregisterWorkerRequest,
                               context: grpc.aio.ServicerContext) -> pb.DeregisterWorkerResponse:
        removed = await self.store.delete_worker(*_worker_ids(request))
        return pb.DeregisterWorkerResponse(removed=removed)

    @redis_rpc
    async def DeregisterPolicy(self, request: pb.DeregisterPolicyRequest,
                               context: grpc.aio.ServicerContext) -> pb.DeregisterPolicyResponse:
        run, pid = _policy_ids(request)
        removed = await self.store.delete_policy(run, pid)
        if removed:
            log.info("run %s: policy %s deregistered", run, pid)
            await self.coordinator.policy_left(run)
        return pb.DeregisterPolicyResponse(removed=removed)

    @redis_rpc
    async def DeleteRun(self, request: runs_pb.DeleteRunRequest,
                        context: grpc.aio.ServicerContext) -> runs_pb.DeleteRunResponse:
        """Every key of the run goes; replicas forget it at their next tick (no lock is made
        for a run without workers and policies)."""
        run = ids.check_run_id(request.run_id)
        async with self.coordinator.lock(run):
            deleted = await self.store.delete_run(run)
        self.coordinator.forget(run)
        if not deleted:
            raise NotFound("run_id", f"run {quote(run)} has no state in MWRA")
        log.info("run %s deleted (%d keys)", run, deleted)
        return runs_pb.DeleteRunResponse(run_id=run, deleted=deleted)
