"""What every part of the store shares: the Redis client, the run registry, typed reads."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

from mutualrl.see.keys import RunKeys
from mutualrl.see.store import transfers
from mutualrl.see.store.blocking import BlockingReads
from mutualrl.see.store.entries import Entry, StreamReply
from mutualrl.see.store.layout import as_str
from mutualrl.see.store.ranges import location, plan_reads
from mutualrl.see.store.runs import RunRegistry

# Record ids per HMGET of the index.
_IDS_PER_READ = 1000


class StorePart:
    """Base of the store's parts (publish, rollouts, round stats, successes, inspection)."""

    def __init__(self, runs: RunRegistry, stopping: asyncio.Event,
                 blocking: BlockingReads | None = None) -> None:
        self.runs = runs
        self.r = runs.r
        self.blocking = blocking if blocking is not None else BlockingReads(runs.r, 1 << 30)
        self.cfg = runs.cfg
        self.stopping = stopping

    async def _get(self, key: str) -> bytes | None:
        return cast("bytes | None", await self.r.get(key))

    async def payloads(self, rk: RunKeys, record_ids: Sequence[str]) -> list[bytes | None]:
        """The serialized records of `record_ids` (of run `rk`), in order; None for a record
        that is gone (trimmed by retention, expired, never stored). Two round trips: the index
        entries (HMGET), then the merged ranges of the batch strings (`ranges.plan_reads`) in
        one pipeline; every key is in the run's hash slot."""
        out: list[bytes | None] = []
        for i in range(0, len(record_ids), _IDS_PER_READ):
            part = record_ids[i:i + _IDS_PER_READ]
            locs = cast("list[bytes | None]", await self.r.hmget(rk.idx, part))
            out += await self.payloads_at(rk, part, locs)
        return out

    async def locate(self, rk: RunKeys, record_ids: Sequence[str]) -> list[bytes | None]:
        """The index entries of `record_ids` (None: gone), read before any payload is: the
        caller sizes what it would load (`size_of`) and takes what fits its budget."""
        out: list[bytes | None] = []
        for i in range(0, len(record_ids), _IDS_PER_READ):
            out += cast("list[bytes | None]",
                        await self.r.hmget(rk.idx, record_ids[i:i + _IDS_PER_READ]))
        return out

    def size_of(self, loc: bytes | None) -> int:
        """Bytes the record of index entry `loc` holds: its length (0 when gone); an entry of
        the layout before batch strings does not say, and counts as the largest record."""
        if loc is None:
            return 0
        where = location(loc)
        return self.cfg.limits.max_record_bytes if where is None else where[2]

    async def payloads_at(self, rk: RunKeys, record_ids: Sequence[str],
                          locs: Sequence[bytes | None]) -> list[bytes | None]:
        """As `payloads`, for records whose index entries `locs` the caller already read."""
        found: list[bytes | None] = [None] * len(record_ids)
        reads, old = plan_reads(locs)
        if reads or old:
            async with self.r.pipeline(transaction=False) as pipe:
                for rd in reads:
                    pipe.getrange(rk.batch(rd.string_id), rd.start, rd.end - 1)
                for pos in old:
                    pipe.get(rk.rec(record_ids[pos]))
                replies = await pipe.execute()
            for rd, data in zip(reads, replies[:len(reads)], strict=True):
                for pos, payload in rd.cut(data):
                    found[pos] = payload
            for pos, data in zip(old, replies[len(reads):], strict=True):
                found[pos] = data
        return found

    async def _xread(self, positions: dict[str, str], count: int,
                     block: int | None = None, client: Any = None) -> StreamReply:
        # (redis-py wants a dict of its own key/id unions: invariance refuses dict[str, str])
        reply = await (client or self.r).xread(cast("dict[Any, Any]", positions), count=count,
                                               block=block)
        return cast(StreamReply, reply or [])

    async def _xreadgroup(self, group: str, consumer: str, stream: str, start: str, count: int,
                          block: int | None = None, client: Any = None) -> list[Entry]:
        reply = await (client or self.r).xreadgroup(group, consumer, {stream: start}, count=count,
                                        block=block)
        return cast(StreamReply, reply)[0][1] if reply else []

    async def _pending_counts(self, stream: str, group: str, consumer: str, lo: str, hi: str,
                              count: int) -> dict[str, int]:
        """Delivery count per pending entry id of `consumer` in [lo, hi]."""
        info = cast("list[dict[str, Any]]", await self.r.xpending_range(
            stream, group, min=lo, max=hi, count=count, consumername=consumer))
        return {as_str(p["message_id"]): int(p["times_delivered"]) for p in info}

    async def _count_transfers(self, run_id: str, taker: str, kind: int,
                               taken: dict[tuple[str, int], int]) -> None:
        """Count delivered records: (source policy, record round) -> n (run totals and per
        round, in one transaction: transfers.py)."""
        rk = self.runs.keys(run_id)
        ttl = self.runs.retention(await self.runs.get(run_id)).ttl_seconds
        async with self.r.pipeline(transaction=True) as pipe:
            transfers.queue_counts(pipe, rk, taker, kind, taken, ttl)
            await pipe.execute()
