"""Runs in Redis: create, read (with a short cache of the immutable config), list, delete; and
each run's current round (the highest round its records and metric rows hold), which bounds the
rounds requests may name (`check_round`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, cast

from mutualrl.common import bounds, ids
from mutualrl.common.errors import AlreadyExists, InvalidArgument, NotFound, quote
from mutualrl.see.config import SeeConfig
from mutualrl.see.keys import RunKeys, registry_key
from mutualrl.see.store.entries import redis_op
from mutualrl.see.store.layout import as_str
from mutualrl.see.store.paging import Budget
from mutualrl.v1 import experience_pb2 as pb

_RUN_CACHE_SECONDS = 5.0
MAX_RUNS_PAGE = 1000
"""Most runs one ListRuns page holds."""
ROUND_MEMBER = "r"
"""The one member of a run's `current_round` sorted set."""


def queue_round(pipe: Any, rk: RunKeys, round_: int, ttl: int) -> None:
    """Queue on `pipe` (a write's transaction) the raise of the run's current round to
    `round_` (kept when higher) and its expiry with the run's other keys."""
    pipe.zadd(rk.current_round, {ROUND_MEMBER: round_}, gt=True)
    pipe.expire(rk.current_round, ttl)


@dataclass
class Retention:
    """A run's effective retention (its own values, else the server defaults)."""

    max_stream_len: int
    ttl_seconds: int
    max_rounds: int


class RunRegistry:
    """Run configs and the registry of run ids; every other part of the store asks it for a
    run (NotFound when there is none) and for the run's keys."""

    def __init__(self, cfg: SeeConfig, client: Any) -> None:
        self.cfg = cfg
        self.r = client
        # Bounded: at most `max_cached_runs` entries (oldest dropped), each a small config.
        self._cache: dict[str, tuple[float, pb.Run]] = {}
        # The same bound: (read at, current round) per run.
        self._rounds: dict[str, tuple[float, int | None]] = {}

    def keys(self, run_id: str) -> RunKeys:
        return RunKeys(self.cfg.key_prefix, run_id)

    def retention(self, run: pb.Run) -> Retention:
        ret, dflt = run.config.retention, self.cfg.retention
        return Retention(max_stream_len=ret.max_stream_len or dflt.max_stream_len,
                         ttl_seconds=ret.ttl_seconds or dflt.ttl_seconds,
                         max_rounds=ret.max_rounds or dflt.max_rounds)

    async def current_round(self, run_id: str) -> int | None:
        """The run's current round (None: it holds no round yet), as read at most
        `_RUN_CACHE_SECONDS` ago: the horizon it bounds is far wider than the rounds a run
        moves on in that time, whichever SEE process wrote them."""
        hit = self._rounds.get(run_id)
        if hit is not None and time.monotonic() - hit[0] < _RUN_CACHE_SECONDS:
            return hit[1]
        async with redis_op("current_round"):
            score = await self.r.zscore(self.keys(run_id).current_round, ROUND_MEMBER)
        current = None if score is None else int(score)
        self._note_round(run_id, current)
        return current

    def raised_round(self, run_id: str, round_: int) -> None:
        """This process stored a record or row of `round_` (its transaction raised the key)."""
        hit = self._rounds.get(run_id)
        if hit is not None and (hit[1] is None or hit[1] < round_):
            self._rounds[run_id] = (hit[0], round_)

    def _note_round(self, run_id: str, current: int | None) -> None:
        rounds = self._rounds
        rounds.pop(run_id, None)
        while len(rounds) >= self.cfg.limits.max_cached_runs:
            rounds.pop(next(iter(rounds)))
        rounds[run_id] = (time.monotonic(), current)

    async def check_round(self, run_id: str, round_: int, field: str) -> int:
        """`round_` within the bounds of run `run_id` (`mutualrl.common.bounds.check_round`)."""
        return bounds.check_round(round_, field, await self.current_round(run_id),
                                  self.cfg.limits.max_round_ahead)

    def _remember(self, run_id: str, run: pb.Run) -> None:
        cache = self._cache
        cache.pop(run_id, None)
        while len(cache) >= self.cfg.limits.max_cached_runs:
            cache.pop(next(iter(cache)))
        cache[run_id] = (time.monotonic(), run)

    def forget(self, run_id: str) -> None:
        self._cache.pop(run_id, None)
        self._rounds.pop(run_id, None)

    @property
    def cached(self) -> int:
        """Runs held in the config cache (bounded by `limits.max_cached_runs`)."""
        return len(self._cache)

    async def create(self, config: pb.RunConfig, exist_ok: bool = False) -> pb.Run:
        """Store a validated config (`validate.validate_run_config`)."""
        run = pb.Run(created_unix_ms=int(time.time() * 1000))
        run.config.CopyFrom(config)
        rk = self.keys(config.run_id)
        ttl = self.retention(run).ttl_seconds
        async with redis_op("create_run"):
            created = await self.r.set(rk.config, run.SerializeToString(), nx=True, ex=ttl)
            if not created:
                existing = await self.get(config.run_id, use_cache=False)
                if exist_ok and existing.config == config:
                    return existing
                raise AlreadyExists("config.run_id", f"run {quote(config.run_id)} exists"
                                    + ("" if not exist_ok else " with a different config"))
            async with self.r.pipeline(transaction=False) as pipe:
                # One consumer group per policy from the stream's start: records published
                # before a trainer's first fetch are not missed.
                for policy in config.policies:
                    pipe.xgroup_create(rk.stream(pb.ROLLOUT), policy, id="0", mkstream=True)
                pipe.expire(rk.stream(pb.ROLLOUT), ttl)
                await pipe.execute(raise_on_error=False)
            # The registry is global (another slot in a cluster): written after the run exists.
            await self.r.sadd(registry_key(self.cfg.key_prefix), config.run_id)
        self._remember(config.run_id, run)
        return run

    async def get(self, run_id: str, *, use_cache: bool = True, field: str = "run_id"
                  ) -> pb.Run:
        ids.check_run_id(run_id, field)
        if use_cache:
            hit = self._cache.get(run_id)
            if hit is not None and time.monotonic() - hit[0] < _RUN_CACHE_SECONDS:
                return hit[1]
        async with redis_op("get_run"):
            raw = cast("bytes | None", await self.r.get(self.keys(run_id).config))
        if raw is None:
            self.forget(run_id)
            raise NotFound(field, f"run {quote(run_id)} not found")
        run = pb.Run.FromString(raw)
        self._remember(run_id, run)
        return run

    async def list_all(self) -> list[pb.Run]:
        """Every run (in-process callers; the RPC pages: `list_page`)."""
        out: list[pb.Run] = []
        after: str | None = None
        while True:
            page, after = await self.list_page(MAX_RUNS_PAGE, after, None)
            out += page
            if after is None:
                return out

    async def list_page(self, size: int, after: str | None, budget: int | None
                        ) -> tuple[list[pb.Run], str | None]:
        """Up to `size` runs in id order after run id `after`, within `budget` bytes (None:
        no bound; at least one run), and the id the next page starts after (None: no more).
        The registry holds run ids only (each run is made by its secret's holder), so the ids
        are read whole and the configs `size` at a time; runs that expired leave it here."""
        reg = registry_key(self.cfg.key_prefix)
        async with redis_op("list_runs"):
            run_ids = sorted(rid for rid in (as_str(x) for x in await self.r.smembers(reg))
                             if after is None or rid > after)
        room = Budget(budget if budget is not None else 1 << 62)
        runs: list[pb.Run] = []
        for lo in range(0, len(run_ids), size):
            part = run_ids[lo:lo + size]
            async with redis_op("list_runs"):
                # One GET per run (their keys lie in different cluster slots: no MGET).
                async with self.r.pipeline(transaction=False) as pipe:
                    for rid in part:
                        pipe.get(self.keys(rid).config)
                    raws = await pipe.execute()
                gone = [rid for rid, raw in zip(part, raws, strict=True) if raw is None]
                if gone:  # expired runs leave the registry lazily
                    await self.r.srem(reg, *gone)
            for raw in raws:
                if raw is None:
                    continue
                if len(runs) >= size or not room.take(len(raw) + 8):
                    return runs, runs[-1].config.run_id
                runs.append(pb.Run.FromString(raw))
        return runs, None

    async def delete(self, run_id: str) -> int:
        """Delete every key of the run and its registry entry; returns the keys deleted.
        NotFound when nothing of the run exists."""
        rk = self.keys(ids.check_run_id(run_id))
        deleted = 0
        async with redis_op("delete_run"):
            batch: list[bytes | str] = []
            async for key in self._scan_run(rk):
                batch.append(key)
                if len(batch) >= 512:
                    deleted += await self._unlink(batch)
                    batch.clear()
            if batch:
                deleted += await self._unlink(batch)
            registered = int(await self.r.srem(registry_key(self.cfg.key_prefix), run_id))
        self.forget(run_id)
        if not deleted and not registered:
            raise NotFound("run_id", f"run {quote(run_id)} not found")
        return deleted

    def _scan_run(self, rk: RunKeys) -> Any:
        # In a cluster, SCAN runs on every primary; the run's keys all live on one of them.
        return self.r.scan_iter(match=rk.pattern, count=1000)

    async def _unlink(self, keys: list[bytes | str]) -> int:
        return int(await self.r.unlink(*keys))

    def check_policy(self, run: pb.Run, policy_id: str, field: str = "policy_id") -> None:
        if policy_id not in run.config.policies:
            raise InvalidArgument(field, f"{quote(policy_id)} is not a policy of run "
                                         f"{quote(run.config.run_id)}")
