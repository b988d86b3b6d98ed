"""The Redis store behind SEE (redis.asyncio): one object over the store's parts.

The parts, each in its own module: runs (`runs.py`), publish (`publish.py`), peer rollouts and
consumer groups (`rollouts.py`), round statistics (`roundstats.py`), verified successes
(`successes.py`), and inspection: Subscribe, run statistics, records (`inspection.py`). The
servicer validates requests (`mutualrl.see.grpc.requests`, `mutualrl.see.validate`) before it
calls the store. Key layout: `mutualrl.see.keys`; the atomic publish: `lua.py`; the Redis
client: `connect.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterable, Sequence
from typing import Any

from redis import exceptions as rexc

from mutualrl.common import bounds
from mutualrl.common.records import validate_records
from mutualrl.see.config import SeeConfig
from mutualrl.see.keys import KINDS, RunKeys
from mutualrl.see.store.blocking import BlockingReads
from mutualrl.see.store.connect import redis_client
from mutualrl.see.store.inspection import Inspection, RecordPage
from mutualrl.see.store.paging import Budget
from mutualrl.see.store.publish import Publisher, publish_response
from mutualrl.see.store.rollouts import Rollouts
from mutualrl.see.store.roundstats import RoundStats
from mutualrl.see.store.runs import Retention, RunRegistry
from mutualrl.see.store.successes import Successes
from mutualrl.see.validate import validate_run_config
from mutualrl.v1 import experience_pb2 as pb

__all__ = ["RecordPage", "Retention", "SeeStore"]


class SeeStore:
    """All SEE state lives in Redis; this object only caches immutable run configs."""

    def __init__(self, cfg: SeeConfig, client: Any | None = None) -> None:
        self.cfg = cfg
        self.r: Any = client if client is not None else redis_client(cfg)
        # Waits get their own connections (blocking.py); an injected client serves both.
        self.blocking = BlockingReads(
            client if client is not None else redis_client(cfg, blocking=True),
            cfg.redis_max_blocking_reads)
        self.stopping = asyncio.Event()
        self.runs = RunRegistry(cfg, self.r)
        self.publisher = Publisher(self.runs)
        self.rollouts = Rollouts(self.runs, self.stopping, self.blocking)
        self._round_stats = RoundStats(self.runs, self.stopping)
        self._successes = Successes(self.runs, self.stopping)
        self.inspection = Inspection(self.runs, self.stopping, self.blocking)

    async def begin_stop(self) -> None:
        """End Subscribe streams and round-stats waits (the server is draining)."""
        self.stopping.set()

    async def close(self) -> None:
        self.stopping.set()
        await self.r.aclose()
        if self.blocking.r is not self.r:
            await self.blocking.aclose()

    async def ping(self) -> bool:
        try:
            return bool(await self.r.ping())
        except (rexc.RedisError, OSError):
            return False

    def keys(self, run_id: str) -> RunKeys:
        return self.runs.keys(run_id)

    def retention(self, run: pb.Run) -> Retention:
        return self.runs.retention(run)

    # runs
    async def create_run(self, config: pb.RunConfig, exist_ok: bool = False) -> pb.Run:
        validate_run_config(config, self.cfg.limits)
        return await self.runs.create(config, exist_ok)

    async def get_run(self, run_id: str, *, use_cache: bool = True,
                      field: str = "run_id") -> pb.Run:
        return await self.runs.get(run_id, use_cache=use_cache, field=field)

    async def list_runs(self) -> list[pb.Run]:
        return await self.runs.list_all()

    async def list_runs_page(self, size: int, after: str | None
                             ) -> tuple[list[pb.Run], str | None]:
        """A page of runs after run id `after` within the answer's byte budget, and the run id
        the next page starts after (None: no more)."""
        return await self.runs.list_page(size, after, self.cfg.limits.max_response_bytes)

    async def delete_run(self, run_id: str) -> int:
        return await self.runs.delete(run_id)

    # publish
    async def publish(self, run_id: str, records: Sequence[pb.ExperienceRecord],
                      batch_bytes: int | None = None) -> pb.PublishResponse:
        """Validate and store records: the one publish path (the RPC's and in-process callers');
        `batch_bytes` is the request's size when it came over the wire."""
        run = await self.runs.get(run_id, field="run_id")
        if not records:
            return pb.PublishResponse()
        limits = self.cfg.limits
        batch = validate_records(records, run.config, limits, batch_bytes=batch_bytes)
        current = await self.runs.current_round(run_id)
        ahead = limits.max_round_ahead
        if current is not None and max(batch.round) > current + ahead:
            past = next(i for i, r in enumerate(batch.round) if r > current + ahead)
            bounds.check_round(batch.round[past], f"records[{past}].round", current, ahead)
        rids, flags = await self.publisher.publish(run, records, batch)
        return publish_response(rids, flags)

    # reads
    async def fetch_rollouts(self, req: pb.FetchRolloutsRequest, deadline: float | None = None
                             ) -> pb.FetchRolloutsResponse:
        return await self.rollouts.fetch_rollouts(req, deadline)

    async def ack(self, run_id: str, policy_id: str, delivery_ids: Sequence[str]) -> int:
        return await self.rollouts.ack(run_id, policy_id, delivery_ids)

    async def round_stats(self, req: pb.RoundStatsRequest, deadline: float | None = None
                          ) -> pb.RoundStatsResponse:
        return await self._round_stats.round_stats(req, deadline)

    async def successes(self, req: pb.SuccessesRequest) -> pb.SuccessesResponse:
        return await self._successes.successes(req)

    def subscribe(self, req: pb.SubscribeRequest, block_ms: int = 500
                  ) -> AsyncGenerator[pb.ExperienceEvent, None]:
        return self.inspection.subscribe(req, block_ms)

    async def run_stats(self, run_id: str, page_token: str = "", budget: int | None = None
                        ) -> pb.RunStats:
        """A page of the run's statistics (its transfer counts paged; `budget` bytes, None:
        the answer's budget)."""
        return await self.inspection.run_stats(run_id, page_token, budget)

    async def run_stats_all(self, run_id: str) -> pb.RunStats:
        """The run's statistics with every transfer count (in-process readers that aggregate
        them: at most 3 x policies^2 counts, bounded by the run's config)."""
        out = await self.run_stats(run_id)
        page = out
        while page.next_page_token:
            page = await self.run_stats(run_id, page.next_page_token)
            out.transfers.extend(page.transfers)
        out.next_page_token = ""
        return out

    async def payloads(self, run_id: str, record_ids: Sequence[str], budget: int | None = None
                       ) -> list[bytes | None]:
        """The serialized records of `record_ids`, in order (None: gone), as many as fit
        `budget` bytes (None: all), sized from the index before they are read."""
        rk = self.keys(run_id)
        if budget is None:
            return await self.inspection.payloads(rk, record_ids)
        locs = await self.inspection.locate(rk, record_ids)
        room = Budget(budget)
        n = next((i for i, loc in enumerate(locs)
                  if loc is not None and not room.take(self.inspection.size_of(loc))),
                 len(locs))
        return await self.inspection.payloads_at(rk, record_ids[:n], locs[:n])

    async def get_record(self, run_id: str, record_id: str) -> tuple[str, pb.ExperienceRecord]:
        return await self.inspection.get_record(run_id, record_id)

    async def list_records(self, run_id: str, *, kinds: Iterable[int] = KINDS,
                           policy: str | None = None, prompt: str | None = None,
                           round_min: int | None = None, round_max: int | None = None,
                           verified: bool | None = None, cursor: str | None = None,
                           limit: int = 100, scan_budget: int = 20_000) -> RecordPage:
        return await self.inspection.list_records(
            run_id, kinds=kinds, policy=policy, prompt=prompt, round_min=round_min,
            round_max=round_max, verified=verified, cursor=cursor, limit=limit,
            scan_budget=scan_budget)
