"""The MWRA gRPC servicer: validation, leases, leader election, rebalancing, metrics.

A thin shell: it validates requests (INVALID_ARGUMENT / NOT_FOUND naming the field), keeps the
state in Redis (`MwraStore`) and asks the pure core (`mutualrl.mwra.allocation.plan_round`) for a
new plan when a policy asks for a round past the current plan's round.

Replicas. Every replica accepts every call; writes of facts (registrations, heartbeats, costs)
go straight to Redis. Only the holder of a run's leader lock (``mwra:{run}:leader``, TTL
``lock_ttl_seconds``, renewed every ``tick_seconds``) makes plans and marks lost workers. A
follower asked for a new round records the request (``mwra:{run}:want``) and waits for the plan
to appear; the leader's loop serves such requests. When the leader dies its lock lapses and the
next tick of a follower takes it, so a run continues where it was.

Runs. A replica ticks a run only once a call proved it has state (a registration, or a worker or
policy found in it), and stops when nothing in it is live (no worker lease, no policy within its
lease), releasing the lock; calls about unknown runs leave nothing behind. Capacities, unit
counts, weights and step seconds are bounded at validation (`MwraConfig.max_*`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import re
import socket
import time
import uuid
from collections.abc import AsyncIterator

import grpc

from mutualrl.common import ids
from mutualrl.common.errors import InvalidArgument, NotFound, grpc_errors
from mutualrl.common.redis_errors import redis_errors
from mutualrl.mwra.allocation import (
    PolicySpec,
    PoolAssignment,
    PoolWorker,
    Settings,
    admit_late,
    next_turn_plan,
    plan_round,
    round_done,
)
from mutualrl.mwra.config import MwraConfig
from mutualrl.mwra.metrics import ALLOCATED, COST, IDLE, LEADER, LOST, POOL, REBALANCES, forget_run
from mutualrl.mwra.store import MwraStore, PolicyRecord, RunState, WorkerRecord, now_ms
from mutualrl.v1 import allocation_pb2 as pb
from mutualrl.v1 import allocation_pb2_grpc as pb_grpc
from mutualrl.v1 import runs_pb2 as runs_pb

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Allocator"].full_name
ADDRESS_RE = re.compile(r"^[^\s:]+:\d{1,5}$|^\[[0-9A-Fa-f:.]+\]:\d{1,5}$")


def _check_id(field: str, value: str) -> str:
    """Worker, policy and trainer ids follow `ids.NAME` (run ids: `ids.RUN_ID`)."""
    return ids.check_name(value, field)


def _finite(field: str, value: float, *, positive: bool = False,
            limit: float | None = None) -> float:
    if math.isnan(value) or math.isinf(value):
        raise InvalidArgument(field, f"must be finite, got {value}")
    if positive and value <= 0:
        raise InvalidArgument(field, f"must be > 0, got {value}")
    if value < 0:
        raise InvalidArgument(field, f"must be >= 0, got {value}")
    if limit is not None and value > limit:
        raise InvalidArgument(field, f"must be <= {limit:g}, got {value:g}")
    return value


def _nonneg(field: str, value: int, limit: int | None = None) -> int:
    if value < 0:
        raise InvalidArgument(field, f"must be >= 0, got {value}")
    if limit is not None and value > limit:
        raise InvalidArgument(field, f"must be <= {limit}, got {value}")
    return value


class AllocatorService(pb_grpc.AllocatorServicer):
    """Serves one or more runs from Redis; see the module docstring for replicas."""

    def __init__(self, cfg: MwraConfig, store: MwraStore) -> None:
        self.cfg = cfg
        self.store = store
        self.replica = cfg.replica_id or f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
        self.settings = Settings(strategy=cfg.strategy, hysteresis=cfg.hysteresis,
                                 turn_policies=cfg.turn_policies)
        self._runs: set[str] = set()
        self._leading: dict[str, float] = {}  # run -> monotonic time the lock is surely ours to
        self._locks: dict[str, asyncio.Lock] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    # lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._background())

    async def close(self) -> None:
        """Stop the background loop and release this replica's leader locks."""
        await self.stop_background()
        for run in list(self._leading):
            with contextlib.suppress(Exception):
                await self.store.release(run, self.replica)
        self._leading.clear()

    async def stop_background(self) -> None:
        """Stop the background loop, keeping the locks (they lapse after their TTL)."""
        # A flag, not only Task.cancel(): a cancellation that lands inside a Redis call can be
        # swallowed by the client library, and the loop would then run on forever.
        self._stopping.set()
        if self._loop_task is not None:
            done, _ = await asyncio.wait({self._loop_task}, timeout=self.cfg.tick_seconds + 2.0)
            if not done:
                self._loop_task.cancel()
                await asyncio.wait({self._loop_task}, timeout=2.0)

    def is_leader(self, run_id: str) -> bool:
        return self._leading.get(run_id, 0.0) > time.monotonic()

    async def _lead(self, run_id: str) -> bool:
        """Take or renew the run's lock; True while this replica holds it. A run with neither
        workers nor policies (deleted) is forgotten: nothing to lead, no lock made."""
        start = time.monotonic()
        held = await self.store.acquire_or_renew(run_id, self.replica, self.cfg.lock_ttl_seconds)
        if held < 0:
            self._forget(run_id)
            return False
        ok = held == 1
        if ok:
            if not self.is_leader(run_id):
                log.info("replica %s leads run %s", self.replica, run_id)
            # Count the TTL from before the call and keep a margin for clock drift.
            self._leading[run_id] = start + 0.8 * self.cfg.lock_ttl_seconds
        else:
            self._leading.pop(run_id, None)
        LEADER.labels(run_id).set(1 if ok else 0)
        return ok

    def _forget(self, run_id: str) -> None:
        self._runs.discard(run_id)
        self._leading.pop(run_id, None)
        self._locks.pop(run_id, None)
        forget_run(run_id)

    def _lock(self, run_id: str) -> asyncio.Lock:
        return self._locks.setdefault(run_id, asyncio.Lock())

    async def _background(self) -> None:
        """Every tick, for each run seen: hold the lock; as leader, reap leases and serve
        rebalance requests that followers forwarded."""
        while not self._stopping.is_set():
            for run in list(self._runs):
                if self._stopping.is_set():
                    return
                try:
                    await self._tick(run)
                except asyncio.CancelledError:
                    raise
                except Exception:  # Redis hiccup: try again next tick, keep serving
                    log.exception("background tick of run %s failed", run)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.cfg.tick_seconds)

    async def _tick(self, run_id: str) -> None:
        if not await self._lead(run_id):
            return
        state = await self.store.load(run_id)
        now = now_ms()
        expired = [w for w, exp in state.leases.items() if exp <= now and w not in state.lost]
        for wid in await self.store.mark_lost(run_id, expired):
            LOST.labels(run_id).inc()
            log.warning("run %s: worker %s lost (lease lapsed)", run_id, wid)
        if self._idle(state, now):
            # Nothing live to allocate for: stop ticking it and let the lock go, so a replica
            # spends nothing on runs that ended; the next call that finds state tracks it again.
            await self.store.release(run_id, self.replica)
            self._forget(run_id)
            log.info("run %s is idle (no live worker or policy): no longer ticked", run_id)
            return
        want = await self.store.wanted_round(run_id)
        if state.plan is not None and state.plan.strategy == "time-share":
            await self._next_turn(run_id)  # a report a follower took may end a turn
        if want >= 0 and (state.plan is None or want > state.plan.round):
            await self._rebalance(run_id, want)  # a follower was asked for a new round
        elif state.plan is not None and self._left_out(state, now):
            await self._admit(run_id)
        elif state.plan is not None:
            self._export(run_id, state.plan, state)

    def _idle(self, state: RunState, now: int) -> bool:
        """No worker holds a lease and no policy showed a sign of life within its lease."""
        horizon = now - int(self.cfg.policy_lease_seconds * 1000)
        return (all(exp <= now for exp in state.leases.values())
                and all(seen <= horizon for seen in state.seen.values()))

    # planning ----------------------------------------------------------------------------
    def _pool(self, state: RunState, now: int) -> tuple[list[PoolWorker], Settings]:
        """The live pool in the run's unit, and the settings to plan it with (a short pool is
        shared when its units are CPU threads, turned over when they are GPUs)."""
        live = [w for w in state.workers.values() if state.leases.get(w.worker_id, 0) > now]
        unit = self.cfg.unit
        if unit == "auto":
            unit = "gpu" if any(w.gpu_count > 0 for w in live) else "cpu"
        short = self.cfg.short_pool
        if short == "auto":
            short = "share" if unit == "cpu" else "time-share"
        pool = [PoolWorker(w.worker_id, w.gpu_count if unit == "gpu" else w.cpu_slots,
                           cpu_slots=w.cpu_slots, rollout_address=w.rollout_address)
                for w in live]
        return pool, dataclasses.replace(self.settings, short_pool=short)

    def _live_policies(self, state: RunState, now: int) -> list[PolicySpec]:
        horizon = now - int(self.cfg.policy_lease_seconds * 1000)
        out = []
        for pid, rec in state.policies.items():
            if state.seen.get(pid, 0) <= horizon:
                continue
            cost = state.costs.get(pid)
            out.append(PolicySpec(pid, min_units=rec.min_units, weight=rec.weight,
                                  rollout_budget=rec.rollout_budget,
                                  cost=cost.smoothed if cost else None))
        return out

    @staticmethod
    def _reported(state: RunState) -> dict[str, int]:
        return {pid: c.last_round for pid, c in state.costs.items()}

    async def _rebalance(self, run_id: str, round_: int) -> PoolAssignment | None:
        """Make the plan for `round_` (leader only); returns the plan in force afterwards."""
        async with self._lock(run_id):
            state = await self.store.load(run_id)
            plan = state.plan
            if plan is not None and (plan.round > round_ or (plan.round == round_
                                                             and not plan.empty)):
                return plan  # someone made it meanwhile; a round's plan is fixed once made
            now = now_ms()
            live = [p.policy_id for p in self._live_policies(state, now)]
            if plan is not None and not round_done(plan, self._reported(state), live):
                return plan  # time-share: later turns of the current round still train
            pool, settings = self._pool(state, now)
            new = plan_round(plan, self._live_policies(state, now), pool, settings, round_)
            version = await self.store.commit_plan(run_id, self.replica, state.version, new)
            if version < 0:  # lost the lock or raced: what is in Redis is the truth
                self._leading.pop(run_id, None)
                fresh, _ = await self.store.load_plan(run_id)
                return fresh
            if plan is None or new.epoch != plan.epoch:
                REBALANCES.labels(run_id).inc()
                log.info("run %s round %d epoch %d (%s): %s", run_id, new.round, new.epoch,
                         new.strategy, new.units)
            self._export(run_id, new, state)
            return new

    def _left_out(self, state: RunState, now: int) -> list[str]:
        """Live policies the current plan was made without (they registered after it, or came
        back after their lease lapsed): `_admit` takes them into the round."""
        plan = state.plan
        if plan is None:
            return []
        return sorted({p.policy_id for p in self._live_policies(state, now)}
                      - set(plan.policies))

    async def _admit(self, run_id: str) -> PoolAssignment | None:
        """Re-plan the current round with the live policies it left out (leader only; a new
        epoch of the same round). A trainer that loads its model more slowly than its peers
        registers after the first plan was made; without this it would sit that round out
        and its peers would wait for its records until their deadlines. A time-share round
        gives it turns after the planned ones (`admit_late`)."""
        async with self._lock(run_id):
            state = await self.store.load(run_id)
            plan, now = state.plan, now_ms()
            if plan is None or not self._left_out(state, now):
                return plan
            pool, settings = self._pool(state, now)
            live = self._live_policies(state, now)
            admitted = admit_late(plan, live, pool, settings)  # time-share with turns only
            new = admitted or plan_round(plan, live, pool, settings, plan.round)
            if await self.store.commit_plan(run_id, self.replica, state.version, new) < 0:
                self._leading.pop(run_id, None)
                fresh, _ = await self.store.load_plan(run_id)
                return fresh
            REBALANCES.labels(run_id).inc()
            log.info("run %s round %d epoch %d (%s): took in %s: %s", run_id, new.round,
                     new.epoch, new.strategy, ", ".join(self._left_out(state, now)), new.units)
            self._export(run_id, new, state)
            return new

    async def _next_turn(self, run_id: str) -> None:
        """time-share: hand the pool to the round's next turn once the active turn reported
        the round (leader only; followers' reports are picked up by the leader's tick)."""
        if not (self.is_leader(run_id) or await self._lead(run_id)):
            return
        async with self._lock(run_id):
            state = await self.store.load(run_id)
            if state.plan is None:
                return
            now = now_ms()
            pool, _ = self._pool(state, now)
            new = next_turn_plan(state.plan, self._live_policies(state, now), pool,
                                 self._reported(state))
            if new is None:
                return
            if await self.store.commit_plan(run_id, self.replica, state.version, new) < 0:
                self._leading.pop(run_id, None)
                return
            REBALANCES.labels(run_id).inc()
            log.info("run %s round %d turn %d (time-share): %s", run_id, new.round, new.turn,
                     new.active)
            self._export(run_id, new, state)

    def _export(self, run_id: str, plan: PoolAssignment, state: RunState) -> None:
        for pid in state.policies:
            ALLOCATED.labels(run_id, pid).set(plan.units.get(pid, 0))
            cost = state.costs.get(pid)
            if cost is not None and cost.smoothed is not None:
                COST.labels(run_id, pid).set(cost.smoothed)
        IDLE.labels(run_id).set(plan.idle_units)
        POOL.labels(run_id).set(plan.pool_units)

    async def _plan_for(self, run_id: str, policy_id: str,
                        round_: int) -> PoolAssignment | None:
        """The plan in force for a policy that asks for `round_`, rebalancing when it is new
        and taking the policy into the current round when the plan was made without it."""
        plan, _ = await self.store.load_plan(run_id)
        if plan is not None and (plan.round > round_ or (plan.round == round_ and not plan.empty)):
            if policy_id in plan.policies:
                return plan
            if self.is_leader(run_id) or await self._lead(run_id):
                return await self._admit(run_id)
            # Follower: the leader's next tick takes the policy in.
            deadline = time.monotonic() + self.cfg.follower_wait_seconds
            while time.monotonic() < deadline:
                await asyncio.sleep(min(0.05, self.cfg.tick_seconds))
                fresh, _ = await self.store.load_plan(run_id)
                if fresh is not None and policy_id in fresh.policies:
                    return fresh
                if self.is_leader(run_id):
                    return await self._admit(run_id)
            return plan
        if self.is_leader(run_id) or await self._lead(run_id):
            return await self._rebalance(run_id, round_)
        # Follower: forward the request through Redis and wait for the leader's plan.
        await self.store.want_round(run_id, round_)
        deadline = time.monotonic() + self.cfg.follower_wait_seconds
        while time.monotonic() < deadline:
            await asyncio.sleep(min(0.05, self.cfg.tick_seconds))
            plan, _ = await self.store.load_plan(run_id)
            if plan is not None and plan.round >= round_:
                return plan
            if self.is_leader(run_id):  # our own loop took over a dead leader's lock
                return await self._rebalance(run_id, round_)
        return plan

    # conversions -------------------------------------------------------------------------
    @staticmethod
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
            slices=slices, pool_units=plan.pool_units)

    def _policy_info(self, run_id: str, state: RunState, pid: str, now: int) -> pb.PolicyInfo:
        rec = state.policies[pid]
        cost = state.costs.get(pid)
        seen = state.seen.get(pid, 0)
        info = pb.PolicyInfo(
            run_id=run_id, policy_id=pid, trainer_id=rec.trainer_id,
            live=seen > now - int(self.cfg.policy_lease_seconds * 1000), last_seen_unix_ms=seen,
            min_units=rec.min_units, weight=rec.weight, rollout_budget=rec.rollout_budget)
        if cost is not None:
            info.smoothed_cost = cost.smoothed or 0.0
            info.reports = cost.reports
            info.last_seconds, info.last_tokens = cost.last_seconds, cost.last_tokens
            info.last_samples, info.last_units = cost.last_samples, cost.last_units
            info.last_round = cost.last_round
        return info

    @staticmethod
    def _run_id(run_id: str) -> str:
        return ids.check_run_id(run_id)

    def _track(self, run_id: str) -> None:
        """Tick the run from now on: called once a call proved that it has state (a
        registration, or a worker or policy found in it). A call answered NOT_FOUND or
        INVALID_ARGUMENT leaves nothing behind, so unknown run ids cost nothing later."""
        self._runs.add(run_id)

    def _lease(self, worker_id: str, expires: int) -> pb.Lease:
        return pb.Lease(worker_id=worker_id, lease_seconds=self.cfg.worker_lease_seconds,
                        expires_unix_ms=expires)

    # RPCs --------------------------------------------------------------------------------
    @grpc_errors
    @redis_errors
    async def RegisterWorker(self, request: pb.RegisterWorkerRequest,
                             context: grpc.aio.ServicerContext) -> pb.Lease:
        run = self._run_id(request.run_id)
        if not request.HasField("worker"):
            raise InvalidArgument("worker", "is required")
        w = request.worker
        wid = _check_id("worker.worker_id", w.worker_id)
        cap = w.capacity
        _nonneg("worker.capacity.cpu_slots", cap.cpu_slots, self.cfg.max_worker_cpu_slots)
        _nonneg("worker.capacity.gpu_count", cap.gpu_count, self.cfg.max_worker_gpus)
        if cap.cpu_slots == 0 and cap.gpu_count == 0:
            raise InvalidArgument("worker.capacity", "zero capacity: cpu_slots or gpu_count "
                                  "must be > 0")
        if w.rollout_address and not ADDRESS_RE.match(w.rollout_address):
            raise InvalidArgument("worker.rollout_address",
                                  f"{w.rollout_address[:64]!r} is not host:port")
        if len(w.labels) > 64 or any(len(k) > 128 or len(v) > 1024 for k, v in w.labels.items()):
            raise InvalidArgument("worker.labels", "at most 64 labels, keys <= 128 and values "
                                  "<= 1024 characters")
        if len(cap.gpu_kind) > 128:
            raise InvalidArgument("worker.capacity.gpu_kind", "at most 128 characters")
        rec = WorkerRecord(worker_id=wid, cpu_slots=cap.cpu_slots, gpu_count=cap.gpu_count,
                           gpu_kind=cap.gpu_kind, labels=dict(w.labels),
                           rollout_address=w.rollout_address, registered_ms=now_ms())
        expires = await self.store.put_worker(run, rec, self.cfg.worker_lease_seconds)
        self._track(run)
        log.info("run %s: worker %s registered (cpu %d, gpu %d %s)", run, wid, cap.cpu_slots,
                 cap.gpu_count, cap.gpu_kind)
        return self._lease(wid, expires)

    @grpc_errors
    @redis_errors
    async def Heartbeat(self, request: pb.HeartbeatRequest,
                        context: grpc.aio.ServicerContext) -> pb.Lease:
        run = self._run_id(request.run_id)
        wid = _check_id("worker_id", request.worker_id)
        renewed = await self.store.renew_lease(run, wid, self.cfg.worker_lease_seconds)
        if renewed is None:
            raise NotFound("worker_id", f"worker {wid!r} is not registered in run {run!r}")
        self._track(run)
        expires, revived = renewed
        if revived:
            log.info("run %s: worker %s is back; it rejoins the pool at the next rebalance",
                     run, wid)
        return self._lease(wid, expires)

    @grpc_errors
    @redis_errors
    async def DeregisterWorker(self, request: pb.DeregisterWorkerRequest,
                               context: grpc.aio.ServicerContext) -> pb.DeregisterWorkerResponse:
        run = self._run_id(request.run_id)
        wid = _check_id("worker_id", request.worker_id)
        return pb.DeregisterWorkerResponse(removed=await self.store.delete_worker(run, wid))

    @grpc_errors
    @redis_errors
    async def RegisterPolicy(self, request: pb.RegisterPolicyRequest,
                             context: grpc.aio.ServicerContext) -> pb.PolicyInfo:
        run = self._run_id(request.run_id)
        pid = _check_id("policy_id", request.policy_id)
        if request.trainer_id:
            _check_id("trainer_id", request.trainer_id)
        if request.min_units < 0:
            raise InvalidArgument("min_units", f"must be >= 1 (0 = 1), got {request.min_units}")
        _nonneg("min_units", request.min_units, self.cfg.max_units)
        weight = _finite("weight", request.weight, limit=self.cfg.max_weight) or 1.0
        if request.rollout_budget < 0:
            raise InvalidArgument("rollout_budget", f"must be >= 0, got {request.rollout_budget}")
        rec = PolicyRecord(policy_id=pid, trainer_id=request.trainer_id,
                           min_units=request.min_units or 1, weight=weight,
                           rollout_budget=request.rollout_budget, registered_ms=now_ms())
        await self.store.put_policy(run, rec)
        self._track(run)
        log.info("run %s: policy %s registered (trainer %s)", run, pid, rec.trainer_id or "-")
        state = await self.store.load(run)
        return self._policy_info(run, state, pid, now_ms())

    @grpc_errors
    @redis_errors
    async def PolicyHeartbeat(self, request: pb.PolicyHeartbeatRequest,
                              context: grpc.aio.ServicerContext) -> pb.PolicyInfo:
        run = self._run_id(request.run_id)
        pid = _check_id("policy_id", request.policy_id)
        if not await self.store.touch_policy(run, pid):
            raise NotFound("policy_id", f"policy {pid!r} is not registered in run {run!r}")
        self._track(run)
        state = await self.store.load(run)
        return self._policy_info(run, state, pid, now_ms())

    @grpc_errors
    @redis_errors
    async def DeregisterPolicy(self, request: pb.DeregisterPolicyRequest,
                               context: grpc.aio.ServicerContext) -> pb.DeregisterPolicyResponse:
        run = self._run_id(request.run_id)
        pid = _check_id("policy_id", request.policy_id)
        return pb.DeregisterPolicyResponse(removed=await self.store.delete_policy(run, pid))

    @grpc_errors
    @redis_errors
    async def ReportStepCost(self, request: pb.StepCostReport,
                             context: grpc.aio.ServicerContext) -> pb.StepCostAck:
        run = self._run_id(request.run_id)
        pid = _check_id("policy_id", request.policy_id)
        _nonneg("round", request.round)
        seconds = _finite("seconds", request.seconds, positive=True,
                          limit=self.cfg.max_step_seconds)
        _nonneg("tokens", request.tokens)
        _nonneg("samples", request.samples)
        if request.units < 1:
            raise InvalidArgument("units", f"must be >= 1, got {request.units}")
        _nonneg("units", request.units, self.cfg.max_units)
        if not await self.store.touch_policy(run, pid):
            raise NotFound("policy_id", f"policy {pid!r} is not registered in run {run!r}")
        self._track(run)
        await self.store.record_cost(run, pid, round_=request.round, seconds=seconds,
                                     tokens=request.tokens, samples=request.samples,
                                     units=request.units, alpha=self.cfg.smoothing)
        plan, _ = await self.store.load_plan(run)
        if plan is not None and plan.strategy == "time-share" and pid in plan.active:
            await self._next_turn(run)
        state = await self.store.load(run)
        cost = state.costs[pid].smoothed
        if cost is not None:
            COST.labels(run, pid).set(cost)
        return pb.StepCostAck(policy=self._policy_info(run, state, pid, now_ms()))

    @grpc_errors
    @redis_errors
    async def GetAllocation(self, request: pb.GetAllocationRequest,
                            context: grpc.aio.ServicerContext) -> pb.Allocation:
        run = self._run_id(request.run_id)
        pid = _check_id("policy_id", request.policy_id)
        _nonneg("round", request.round)
        if not await self.store.touch_policy(run, pid):
            raise NotFound("policy_id", f"policy {pid!r} is not registered in run {run!r}")
        self._track(run)
        plan = await self._plan_for(run, pid, request.round)
        state = await self.store.load(run)
        rec = state.policies.get(pid)
        if rec is None:
            raise NotFound("policy_id", f"policy {pid!r} was deregistered")
        alloc = self._allocation(run, pid, plan, rec.rollout_budget)
        if plan is not None and plan.strategy == "time-share" and plan.round < request.round:
            # Turns of an earlier round still train: this round's turn has not come yet.
            alloc.active, alloc.rollout_budget, alloc.threads = False, 0, 0
        return alloc

    @grpc_errors
    @redis_errors
    async def WatchAllocation(self, request: pb.WatchAllocationRequest,
                              context: grpc.aio.ServicerContext) -> AsyncIterator[pb.Allocation]:
        run = self._run_id(request.run_id)
        pid = _check_id("policy_id", request.policy_id)
        last: bytes | None = None
        # context.done(): stop polling once the client went away, even if the cancellation of
        # this handler was swallowed inside a Redis call.
        while not context.done():
            state = await self.store.load(run)
            rec = state.policies.get(pid)
            if rec is None:
                raise NotFound("policy_id", f"policy {pid!r} is not registered in run {run!r}")
            msg = self._allocation(run, pid, state.plan, rec.rollout_budget)
            blob = msg.SerializeToString(deterministic=True)
            if blob != last:
                last = blob
                yield msg
            await asyncio.sleep(self.cfg.watch_poll_seconds)

    @grpc_errors
    @redis_errors
    async def ListAllocations(self, request: pb.ListAllocationsRequest,
                              context: grpc.aio.ServicerContext) -> pb.AllocationTable:
        run = self._run_id(request.run_id)
        state = await self.store.load(run)
        if not state.workers and not state.policies:
            raise NotFound("run_id", f"run {run!r} has no workers or policies")
        now = now_ms()
        plan = state.plan
        table = pb.AllocationTable(run_id=run, leader=state.leader or "", round=-1)
        if plan is not None:
            table.epoch, table.round, table.strategy = plan.epoch, plan.round, plan.strategy
            table.idle_units, table.pool_units = plan.idle_units, plan.pool_units
        for pid in sorted(state.policies):
            table.policies.append(self._policy_info(run, state, pid, now))
            table.allocations.append(self._allocation(run, pid, plan,
                                                      state.policies[pid].rollout_budget))
        pool = {w.worker_id: w.units for w in self._pool(state, now)[0]}
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
                lease=pb.Lease(worker_id=wid, lease_seconds=self.cfg.worker_lease_seconds,
                               expires_unix_ms=expires),
                state="live" if expires > now else "lost", holder=",".join(sorted(held)),
                units_by_policy=held, units=pool.get(wid, 0)))
        return table

    @grpc_errors
    @redis_errors
    async def DeleteRun(self, request: runs_pb.DeleteRunRequest,
                        context: grpc.aio.ServicerContext) -> runs_pb.DeleteRunResponse:
        """Every key of the run goes; replicas forget it at their next tick (no lock is made
        for a run without workers and policies)."""
        run = ids.check_run_id(request.run_id)
        async with self._lock(run):
            deleted = await self.store.delete_run(run)
        self._forget(run)
        if not deleted:
            raise NotFound("run_id", f"run {run!r} has no state in MWRA")
        log.info("run %s deleted (%d keys)", run, deleted)
        return runs_pb.DeleteRunResponse(run_id=run, deleted=deleted)
