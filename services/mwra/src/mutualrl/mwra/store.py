"""MWRA state in Redis: workers, leases, policies, costs, the current plan and the leader lock.

Keys follow the common scheme (`mutualrl.common.keys`): every key of a run is
``<prefix>:mwra:{<run_id>}:<name>``, the run id a hash tag so a Redis Cluster keeps a run in one
slot (the Lua scripts below touch several keys of one run). With the default prefix "mrl":

    mrl:mwra:{run}:workers   hash  worker_id -> JSON (capacity, labels, rollout_address)
    mrl:mwra:{run}:leases    hash  worker_id -> lease expiry (Unix ms)
    mrl:mwra:{run}:lost      set   workers whose lease lapsed (marked by the leader's reaper)
    mrl:mwra:{run}:policies  hash  policy_id -> JSON (trainer_id, min_units, weight, budget,
                                   max_rollout_workers)
    mrl:mwra:{run}:seen      hash  policy_id -> last sign of life (Unix ms)
    mrl:mwra:{run}:costs     hash  policy_id -> JSON (smoothed costs of the round, its
                                   rollouts and its update; last report, report count)
    mrl:mwra:{run}:plan      hash  version -> n (bumped by every write), json -> the current
                                   PoolAssignment (who holds which units this round)
    mrl:mwra:{run}:want      str   highest round a follower was asked for (served by the leader)
    mrl:mwra:{run}:leader    str   replica id of the leader, with a TTL (the lock)

Only the lock holder writes the plan, and the write is fenced (the script checks the lock and the
version it read), so a paused ex-leader cannot overwrite its successor's plan.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import WatchError

from mutualrl.common import redis_connect
from mutualrl.common.keys import DEFAULT_PREFIX, KeySpace
from mutualrl.mwra.allocation import PoolAssignment, ema


def now_ms() -> int:
    return int(time.time() * 1000)


class Keys:
    """Key names of one run."""

    def __init__(self, run_id: str, prefix: str = DEFAULT_PREFIX) -> None:
        base = KeySpace(prefix, "mwra").run_base(run_id)
        self.workers = f"{base}workers"
        self.leases = f"{base}leases"
        self.lost = f"{base}lost"
        self.policies = f"{base}policies"
        self.seen = f"{base}seen"
        self.costs = f"{base}costs"
        self.plan = f"{base}plan"
        self.want = f"{base}want"
        self.leader = f"{base}leader"

    def all(self) -> list[str]:
        return [self.workers, self.leases, self.lost, self.policies, self.seen, self.costs,
                self.plan, self.want, self.leader]


@dataclass
class WorkerRecord:
    worker_id: str
    cpu_slots: int
    gpu_count: int
    gpu_kind: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    rollout_address: str = ""
    registered_ms: int = 0


@dataclass
class PolicyRecord:
    policy_id: str
    trainer_id: str = ""
    min_units: int = 1
    weight: float = 1.0
    rollout_budget: int = 0
    registered_ms: int = 0
    max_rollout_workers: int = 0


@dataclass
class CostRecord:
    smoothed: float | None = None
    reports: int = 0
    last_seconds: float = 0.0
    last_tokens: int = 0
    last_samples: int = 0
    last_units: int = 0
    last_round: int = -1
    rollout: float | None = None
    """Smoothed unit-seconds of the rounds' rollouts (None until one was measured)."""
    update: float | None = None
    """Smoothed unit-seconds of the rounds' updates (None until one was measured)."""
    last_rollout_seconds: float = 0.0
    last_update_seconds: float = 0.0
    seconds_by_units: dict[str, float] = field(default_factory=dict)
    """Smoothed seconds per round at each unit count the policy ran on (JSON keys are
    strings), the last `MAX_UNIT_COUNTS` counts: whether more units made its rounds faster."""


MAX_UNIT_COUNTS = 8
"""Unit counts a policy's `CostRecord.seconds_by_units` keeps (the most recent)."""


@dataclass
class RunState:
    """One consistent read of a run (one round trip)."""

    workers: dict[str, WorkerRecord]
    leases: dict[str, int]
    lost: set[str]
    policies: dict[str, PolicyRecord]
    seen: dict[str, int]
    costs: dict[str, CostRecord]
    plan: PoolAssignment | None
    version: int
    leader: str | None


# KEYS: leader, workers, policies. ARGV: replica id, TTL ms. Returns 1 (held), 0 (another
# replica holds it) or -1: the run has neither workers nor policies (deleted, or never made), so
# there is nothing to lead and no lock key is (re)created.
_ACQUIRE = """
if redis.call('EXISTS', KEYS[2], KEYS[3]) == 0 then return -1 end
local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS: leader, plan. ARGV: replica id, version read, plan JSON. Returns the new version, or
# -1 (not the leader) / -2 (someone wrote since the read).
_COMMIT = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local v = tonumber(redis.call('HGET', KEYS[2], 'version') or '0')
if v ~= tonumber(ARGV[2]) then return -2 end
redis.call('HSET', KEYS[2], 'version', v + 1, 'json', ARGV[3])
return v + 1
"""

# KEYS: want. ARGV: round. Keeps the highest requested round.
_WANT = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '-1')
if tonumber(ARGV[1]) > cur then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
"""


def _dump(obj: Any) -> str:
    return json.dumps(asdict(obj), sort_keys=True, separators=(",", ":"))


class MwraStore:
    """Async access to the Redis state of every run this replica serves."""

    def __init__(self, redis: aioredis.Redis, prefix: str = DEFAULT_PREFIX) -> None:
        self.r = redis
        self.prefix = prefix
        self._acquire = redis.register_script(_ACQUIRE)
        self._release = redis.register_script(_RELEASE)
        self._commit = redis.register_script(_COMMIT)
        self._want = redis.register_script(_WANT)

    @classmethod
    def from_url(cls, url: str, timeout: float = 5.0, prefix: str = DEFAULT_PREFIX,
                 max_connections: int = 64) -> MwraStore:
        # Timeouts: a Redis that hangs must fail calls (UNAVAILABLE), never hang them.
        # A blocking pool: a burst of calls beyond `max_connections` waits up to `timeout` for a
        # free connection (redis-py's default pool refuses at once: "Too many connections").
        # `redis+cluster://...` gives a Redis Cluster client (mutualrl.common.redis_connect).
        client = redis_connect.async_client(
            url, max_connections=max_connections, pool_timeout=timeout, decode_responses=True,
            socket_timeout=timeout, socket_connect_timeout=timeout)
        return cls(client, prefix)

    def keys(self, run_id: str) -> Keys:
        return Keys(run_id, self.prefix)

    async def close(self) -> None:
        await self.r.aclose()

    # workers -----------------------------------------------------------------------------
    async def put_worker(self, run_id: str, rec: WorkerRecord, lease_seconds: float) -> int:
        k = self.keys(run_id)
        expires = now_ms() + int(lease_seconds * 1000)
        async with self.r.pipeline(transaction=True) as p:
            p.hset(k.workers, rec.worker_id, _dump(rec))
            p.hset(k.leases, rec.worker_id, expires)
            p.srem(k.lost, rec.worker_id)
            await p.execute()
        return expires

    async def renew_lease(self, run_id: str, worker_id: str,
                          lease_seconds: float) -> tuple[int, bool] | None:
        """New expiry and whether the worker was lost before; None when it is not registered."""
        k = self.keys(run_id)
        if not await self.r.hexists(k.workers, worker_id):
            return None
        expires = now_ms() + int(lease_seconds * 1000)
        async with self.r.pipeline(transaction=True) as p:
            p.hset(k.leases, worker_id, expires)
            p.srem(k.lost, worker_id)
            _, revived = await p.execute()
        return expires, bool(revived)

    async def _remove(self, member: str, hashes: list[str], sets: list[str]) -> bool:
        """Remove `member` from `hashes` and `sets` at once; True when the first hash held it."""
        async with self.r.pipeline(transaction=True) as p:
            for h in hashes:
                p.hdel(h, member)
            for s in sets:
                p.srem(s, member)
            removed = (await p.execute())[0]
        return bool(removed)

    async def delete_worker(self, run_id: str, worker_id: str) -> bool:
        k = self.keys(run_id)
        return await self._remove(worker_id, [k.workers, k.leases], [k.lost])

    async def mark_lost(self, run_id: str, worker_ids: list[str]) -> list[str]:
        """Add workers to the lost set; returns those that were not there yet (counted once)."""
        if not worker_ids:
            return []
        k = self.keys(run_id)
        async with self.r.pipeline(transaction=False) as p:
            for wid in worker_ids:
                p.sadd(k.lost, wid)
            added = await p.execute()
        return [w for w, a in zip(worker_ids, added, strict=True) if a]

    async def has_room(self, run_id: str, kind: str, member: str, most: int) -> bool:
        """Whether `member` may be registered in the run's `kind` hash ("workers",
        "policies"): it is there already, or the hash holds fewer than `most`. Checked before
        the write: replicas registering new members at the same moment may pass it by one
        each."""
        key = getattr(self.keys(run_id), kind)
        async with self.r.pipeline(transaction=False) as p:
            p.hexists(key, member)
            p.hlen(key)
            there, count = await p.execute()
        return bool(there) or int(count) < most

    # policies ----------------------------------------------------------------------------
    async def put_policy(self, run_id: str, rec: PolicyRecord) -> None:
        k = self.keys(run_id)
        async with self.r.pipeline(transaction=True) as p:
            p.hset(k.policies, rec.policy_id, _dump(rec))
            p.hset(k.seen, rec.policy_id, now_ms())
            await p.execute()

    async def touch_policy(self, run_id: str, policy_id: str) -> bool:
        """Record a sign of life; False when the policy is not registered."""
        k = self.keys(run_id)
        if not await self.r.hexists(k.policies, policy_id):
            return False
        await self.r.hset(k.seen, policy_id, now_ms())
        return True

    async def delete_policy(self, run_id: str, policy_id: str) -> bool:
        k = self.keys(run_id)
        return await self._remove(policy_id, [k.policies, k.seen, k.costs], [])

    async def record_cost(self, run_id: str, policy_id: str, *, round_: int, seconds: float,
                          tokens: int, samples: int, units: int, alpha: float,
                          rollout_seconds: float = 0.0, update_seconds: float = 0.0,
                          rollout_units: int = 0) -> CostRecord:
        """Fold one step into the policy's EMAs (optimistic transaction: concurrent reports of
        the run retry instead of losing an update). A round reported again (a client's retry
        after a lost answer, a resumed trainer redoing the round) is folded once: the first
        report stands. The rollouts ran on `rollout_units` of the `units` (0: all of them,
        in-process), the update on the rest; a phase reported as 0 s was not measured and
        leaves its EMA as it is."""
        rollout_on = rollout_units or units
        update_on = units - rollout_units if rollout_units else units
        k = self.keys(run_id)
        async with self.r.pipeline(transaction=True) as p:
            while True:
                try:
                    await p.watch(k.costs)
                    raw = await p.hget(k.costs, policy_id)
                    rec = CostRecord(**json.loads(raw)) if raw else CostRecord()
                    if rec.reports and rec.last_round == round_:
                        await p.unwatch()
                        await self.r.hset(k.seen, policy_id, now_ms())
                        return rec
                    rec.smoothed = ema(rec.smoothed, seconds * units, alpha)
                    at = rec.seconds_by_units.pop(str(units), None)  # re-inserted: most recent
                    rec.seconds_by_units[str(units)] = ema(at, seconds, alpha)
                    while len(rec.seconds_by_units) > MAX_UNIT_COUNTS:
                        rec.seconds_by_units.pop(next(iter(rec.seconds_by_units)))
                    if rollout_seconds > 0:
                        rec.rollout = ema(rec.rollout, rollout_seconds * rollout_on, alpha)
                    if update_seconds > 0:
                        rec.update = ema(rec.update, update_seconds * update_on, alpha)
                    rec.last_rollout_seconds = rollout_seconds
                    rec.last_update_seconds = update_seconds
                    rec.reports += 1
                    rec.last_seconds, rec.last_tokens = seconds, tokens
                    rec.last_samples, rec.last_units, rec.last_round = samples, units, round_
                    p.multi()
                    p.hset(k.costs, policy_id, _dump(rec))
                    p.hset(k.seen, policy_id, now_ms())
                    await p.execute()
                    return rec
                except WatchError:
                    continue

    # whole run ---------------------------------------------------------------------------
    async def load(self, run_id: str) -> RunState:
        k = self.keys(run_id)
        async with self.r.pipeline(transaction=True) as p:
            # The generic command: redis-py 8's cluster transactions pass hgetall()'s `keys`
            # argument on to the reply callback, which refuses it (TypeError).
            for key in (k.workers, k.leases):
                p.execute_command("HGETALL", key)
            p.execute_command("SMEMBERS", k.lost)
            for key in (k.policies, k.seen, k.costs, k.plan):
                p.execute_command("HGETALL", key)
            p.execute_command("GET", k.leader)
            workers, leases, lost, policies, seen, costs, plan, leader = await p.execute()
        return RunState(
            workers={w: WorkerRecord(**json.loads(v)) for w, v in workers.items()},
            leases={w: int(v) for w, v in leases.items()},
            lost=set(lost),
            policies={p_: PolicyRecord(**json.loads(v)) for p_, v in policies.items()},
            seen={p_: int(v) for p_, v in seen.items()},
            costs={p_: CostRecord(**json.loads(v)) for p_, v in costs.items()},
            plan=PoolAssignment.from_json(plan["json"]) if plan.get("json") else None,
            version=int(plan.get("version", 0)),
            leader=leader,
        )

    async def load_plan(self, run_id: str) -> tuple[PoolAssignment | None, int]:
        raw = await self.r.hgetall(self.keys(run_id).plan)
        if not raw.get("json"):
            return None, 0
        return PoolAssignment.from_json(raw["json"]), int(raw.get("version", 0))

    async def commit_plan(self, run_id: str, replica: str, version: int,
                          plan: PoolAssignment) -> int:
        k = self.keys(run_id)
        return int(await self._commit(keys=[k.leader, k.plan],
                                      args=[replica, version, plan.to_json()]))

    async def want_round(self, run_id: str, round_: int) -> None:
        await self._want(keys=[self.keys(run_id).want], args=[round_])

    async def wanted_round(self, run_id: str) -> int:
        raw = await self.r.get(self.keys(run_id).want)
        return int(raw) if raw is not None else -1

    # leader lock -------------------------------------------------------------------------
    async def acquire_or_renew(self, run_id: str, replica: str, ttl_seconds: float) -> int:
        """1: this replica holds the run's lock; 0: another one does; -1: the run has no
        workers and no policies (deleted), so nobody leads it."""
        k = self.keys(run_id)
        return int(await self._acquire(keys=[k.leader, k.workers, k.policies],
                                       args=[replica, int(ttl_seconds * 1000)]))

    async def release(self, run_id: str, replica: str) -> bool:
        return bool(await self._release(keys=[self.keys(run_id).leader], args=[replica]))

    async def delete_run(self, run_id: str) -> int:
        """Delete every key of the run; returns how many existed."""
        return int(await self.r.delete(*self.keys(run_id).all()))

    async def leader(self, run_id: str) -> str | None:
        value = await self.r.get(self.keys(run_id).leader)
        return value.decode() if isinstance(value, bytes) else value  # decode_responses=True
