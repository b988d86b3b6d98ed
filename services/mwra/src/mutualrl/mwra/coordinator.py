"""MWRA's coordination of a run across replicas: the leader lock, the tick loop, rebalancing,
admission of late policies and time-share turns. The servicer (`servicer.py`) calls it; the
plans themselves come from the pure core (`mutualrl.mwra.allocation`).

Replicas. Every replica accepts every call; writes of facts (registrations, heartbeats, costs)
go straight to Redis. Only the holder of a run's leader lock (``mwra:{run}:leader``, TTL
``lock_ttl_seconds``, renewed every ``tick_seconds``) makes plans and marks lost workers. A
follower asked for a new round records the request (``mwra:{run}:want``) and waits for the plan
to appear; the leader's loop serves such requests. When the leader dies its lock lapses and the
next tick of a follower takes it, so a run continues where it was.

Runs. A replica ticks a run only once a call proved it has state (a registration, or a worker or
policy found in it), and stops when nothing in it is live (no worker lease, no policy within its
lease), releasing the lock; calls about unknown runs leave nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
import time
import uuid
from collections.abc import Awaitable, Callable

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
from mutualrl.mwra.store import MwraStore, RunState, now_ms

log = logging.getLogger(__name__)


class Coordinator:
    """Leads the runs this replica has seen; see the module docstring for replicas."""

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
            self.forget(run_id)
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

    def forget(self, run_id: str) -> None:
        self._runs.discard(run_id)
        self._leading.pop(run_id, None)
        self._locks.pop(run_id, None)
        forget_run(run_id)

    def lock(self, run_id: str) -> asyncio.Lock:
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
            self.forget(run_id)
            log.info("run %s is idle (no live worker or policy): no longer ticked", run_id)
            return
        want = await self.store.wanted_round(run_id)
        if state.plan is not None and state.plan.strategy == "time-share":
            await self.next_turn(run_id)  # a report a follower took may end a turn
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
    def pool(self, state: RunState, now: int) -> tuple[list[PoolWorker], Settings]:
        """The live pool in the run's unit, and the settings to plan it with (a short pool is
        shared when its units are CPU threads, turned over when they are GPUs)."""
        live = [w for w in state.workers.values() if state.leases.get(w.worker_id, 0) > now]
        unit = self.cfg.unit
        if unit == "auto":
            unit = "gpu" if any(w.gpu_count > 0 for w in live) else "cpu"
        short = self.cfg.short_pool
        if short == "auto":
            short = "shared" if unit == "cpu" else "time-share"
        pool = [PoolWorker(w.worker_id, w.gpu_count if unit == "gpu" else w.cpu_slots,
                           cpu_slots=w.cpu_slots, rollout_address=w.rollout_address)
                for w in live]
        return pool, dataclasses.replace(self.settings, short_pool=short, unit=unit)

    def _live_policies(self, state: RunState, now: int) -> list[PolicySpec]:
        horizon = now - int(self.cfg.policy_lease_seconds * 1000)
        out = []
        for pid, rec in state.policies.items():
            if state.seen.get(pid, 0) <= horizon:
                continue
            cost = state.costs.get(pid)
            out.append(PolicySpec(pid, min_units=rec.min_units, weight=rec.weight,
                                  rollout_budget=rec.rollout_budget,
                                  cost=cost.smoothed if cost else None,
                                  max_rollout_workers=rec.max_rollout_workers,
                                  rollout_cost=cost.rollout if cost else None,
                                  update_cost=cost.update if cost else None,
                                  seconds_by_units={int(u): t for u, t in
                                                    (cost.seconds_by_units if cost else {})
                                                    .items()}))
        return out

    @staticmethod
    def _reported(state: RunState) -> dict[str, int]:
        return {pid: c.last_round for pid, c in state.costs.items()}

    async def _rebalance(self, run_id: str, round_: int) -> PoolAssignment | None:
        """Make the plan for `round_` (leader only); returns the plan in force afterwards."""
        async with self.lock(run_id):
            state = await self.store.load(run_id)
            plan = state.plan
            if plan is not None and (plan.round > round_ or (plan.round == round_
                                                             and not plan.empty)):
                return plan  # someone made it meanwhile; a round's plan is fixed once made
            now = now_ms()
            live = [p.policy_id for p in self._live_policies(state, now)]
            if plan is not None and not round_done(plan, self._reported(state), live):
                return plan  # time-share: later turns of the current round still train
            pool, settings = self.pool(state, now)
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
        """Policies whose place in the current plan is wrong: live ones it was made without
        (they registered after it, or came back after their lease lapsed), and, outside
        time-share, ones it holds units for that are gone (a trainer that finished its rounds
        deregistered, or its lease lapsed). `_admit` re-plans the round for the live ones, so
        a finished policy's units go to the policies still training at once, not only when
        one of them asks for a round past the plan's (a slow policy behind a fast one that
        finished never does)."""
        plan = state.plan
        if plan is None:
            return []
        live = {p.policy_id for p in self._live_policies(state, now)}
        gone = set() if plan.strategy == "time-share" else set(plan.policies) - live
        return sorted((live - set(plan.policies)) | gone)

    async def _admit(self, run_id: str) -> PoolAssignment | None:
        """Re-plan the current round for the live policies when it left some out or holds
        units for some that are gone (`_left_out`; leader only; a new epoch of the same
        round). A trainer that loads its model more slowly than its peers registers after the
        first plan was made; without this it would sit that round out and its peers would
        wait for its records until their deadlines. A time-share round gives it turns after
        the planned ones (`admit_late`)."""
        async with self.lock(run_id):
            state = await self.store.load(run_id)
            plan, now = state.plan, now_ms()
            if plan is None or not self._left_out(state, now):
                return plan
            pool, settings = self.pool(state, now)
            live = self._live_policies(state, now)
            admitted = admit_late(plan, live, pool, settings)  # time-share with turns only
            new = admitted or plan_round(plan, live, pool, settings, plan.round)
            if await self.store.commit_plan(run_id, self.replica, state.version, new) < 0:
                self._leading.pop(run_id, None)
                fresh, _ = await self.store.load_plan(run_id)
                return fresh
            REBALANCES.labels(run_id).inc()
            log.info("run %s round %d epoch %d (%s): re-planned for %s: %s", run_id,
                     new.round, new.epoch, new.strategy, ", ".join(self._left_out(state, now)),
                     new.units)
            self._export(run_id, new, state)
            return new

    async def policy_left(self, run_id: str) -> None:
        """A policy deregistered (its trainer finished): as the run's leader, hand its units to
        the policies still training now; a follower leaves it to the leader's next tick."""
        if self.is_leader(run_id):
            await self._admit(run_id)

    async def next_turn(self, run_id: str) -> None:
        """time-share: hand the pool to the round's next turn once the active turn reported
        the round (leader only; followers' reports are picked up by the leader's tick)."""
        if not (self.is_leader(run_id) or await self._lead(run_id)):
            return
        async with self.lock(run_id):
            state = await self.store.load(run_id)
            if state.plan is None:
                return
            now = now_ms()
            pool, settings = self.pool(state, now)
            new = next_turn_plan(state.plan, self._live_policies(state, now), pool,
                                 self._reported(state), settings)
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

    async def plan_for(self, run_id: str, policy_id: str,
                       round_: int) -> PoolAssignment | None:
        """The plan in force for a policy that asks for `round_`, rebalancing when it is new
        and taking the policy into the current round when the plan was made without it."""
        state = await self.store.load(run_id)
        plan = state.plan
        if plan is not None and (plan.round > round_ or (plan.round == round_ and not plan.empty)):
            if policy_id in plan.policies and not self._left_out(state, now_ms()):
                return plan
            if self.is_leader(run_id) or await self._lead(run_id):
                return await self._admit(run_id)
            # Follower: the leader's next tick takes the policy in.
            done, fresh = await self._follow(run_id, lambda p: policy_id in p.policies,
                                             lambda: self._admit(run_id))
            return fresh if done else plan
        if self.is_leader(run_id) or await self._lead(run_id):
            return await self._rebalance(run_id, round_)
        # Follower: forward the request through Redis and wait for the leader's plan.
        await self.store.want_round(run_id, round_)
        _, plan = await self._follow(run_id, lambda p: p.round >= round_,
                                     lambda: self._rebalance(run_id, round_))
        return plan

    async def _follow(self, run_id: str, ready: Callable[[PoolAssignment], bool],
                      take_over: Callable[[], Awaitable[PoolAssignment | None]]
                      ) -> tuple[bool, PoolAssignment | None]:
        """Follower: poll Redis for the leader's plan until `ready` holds for it, or until our
        own loop took over a dead leader's lock (then `take_over` makes it here): (True, that
        plan). After `follower_wait_seconds`, (False, the plan read last)."""
        plan: PoolAssignment | None = None
        deadline = time.monotonic() + self.cfg.follower_wait_seconds
        while time.monotonic() < deadline:
            await asyncio.sleep(min(0.05, self.cfg.tick_seconds))
            plan, _ = await self.store.load_plan(run_id)
            if plan is not None and ready(plan):
                return True, plan
            if self.is_leader(run_id):
                return True, await take_over()
        return False, plan

    def track(self, run_id: str) -> None:
        """Tick the run from now on: called once a call proved that it has state (a
        registration, or a worker or policy found in it). A call answered NOT_FOUND or
        INVALID_ARGUMENT leaves nothing behind, so unknown run ids cost nothing later."""
        self._runs.add(run_id)
