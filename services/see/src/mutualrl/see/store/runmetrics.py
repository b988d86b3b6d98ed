"""Per-round metrics of a run's trainers, kept in the run's Redis keys (run_metrics.proto).

Trainers report one row per (policy, round) over gRPC (`RunMetrics.ReportMetrics`); people read
them through REST (`GET /v1/runs/{run}/metrics`, the dashboard's live curves). Rows are appended
to one stream per run, `<prefix>:{<run>}:metrics` (fields p = policy, r = round, t = Unix ms,
v = the values as JSON), capped like the record streams (the run's `max_stream_len`) and
expiring with the run (its `ttl_seconds`, refreshed on every write). A round reported again (a
resumed trainer runs it again) is a new entry: readers keep the latest row per (policy, round).

A row's round is held to the run's bounds (`RunRegistry.check_round`) and raises the run's
current round as a record does; a row's values take at most `MAX_ROW_BYTES` of JSON, so a read
sizes its stream reads (`read`'s `budget`) before it makes them and ends a page early at the
answer's byte budget, `more` set and the cursor after the last row given.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mutualrl.common import bounds
from mutualrl.common.errors import InvalidArgument, NotFound, quote
from mutualrl.see import metrics as m
from mutualrl.see.keys import RunKeys
from mutualrl.see.store import SeeStore
from mutualrl.see.store.entries import check_stream_id, is_last_id, redis_op
from mutualrl.see.store.paging import Budget
from mutualrl.see.store.runs import queue_round
from mutualrl.v1 import run_metrics_pb2 as mpb

MAX_ROWS = 1024
MAX_VALUES = 512
MAX_NAME_CHARS = 128
MAX_ROW_BYTES = 64 * 1024
"""Largest JSON of one row's values (512 values with 80-character names take 50 kB)."""
_ROW_BYTES = 96
"""What a row adds to its values in an answer (cursor, policy, round, time, framing)."""


def stream_key(rk: RunKeys) -> str:
    return rk.base + "metrics"


@dataclass
class Row:
    """One stored metric row."""

    cursor: str
    """Stream id of the row (pass as `after` to read what came later)."""
    policy_id: str
    round: int
    unix_ms: int
    values: dict[str, float]


def check_rows(rows: Sequence[mpb.MetricRow], policies: Sequence[str]) -> None:
    """Validate a ReportMetrics batch as a whole; the error names the first bad field."""
    if not rows:
        raise InvalidArgument("rows", "at least one row is required")
    if len(rows) > MAX_ROWS:
        raise InvalidArgument("rows", f"at most {MAX_ROWS} rows per call, got {len(rows)}")
    known = set(policies)
    for i, row in enumerate(rows):
        where = f"rows[{i}]"
        if row.policy_id not in known:
            raise InvalidArgument(f"{where}.policy_id",
                                  f"{quote(row.policy_id)} is not a policy of the run")
        bounds.check_int(row.round, f"{where}.round", bounds.MAX_ROUND)
        bounds.check_int(row.unix_ms, f"{where}.unix_ms", bounds.MAX_COUNT)
        if len(row.values) > MAX_VALUES:
            raise InvalidArgument(f"{where}.values", f"at most {MAX_VALUES} entries")
        for name, value in row.values.items():
            if not 1 <= len(name) <= MAX_NAME_CHARS or not name.isprintable():
                raise InvalidArgument(f"{where}.values", f"name {quote(name)} must be 1-"
                                      f"{MAX_NAME_CHARS} printable characters")
            if not math.isfinite(value):
                raise InvalidArgument(f"{where}.values[{name}]", "not finite")
        size = len(values_json(row))
        if size > MAX_ROW_BYTES:
            raise InvalidArgument(f"{where}.values", f"{size} bytes of JSON, over the "
                                  f"{MAX_ROW_BYTES}-byte limit of a row")


def values_json(row: mpb.MetricRow) -> str:
    """A row's values as stored (JSON)."""
    return json.dumps(dict(row.values), separators=(",", ":"))


class RunMetricsStore:
    """Metric rows over the SEE store's Redis client and run registry."""

    def __init__(self, store: SeeStore) -> None:
        self.store = store

    async def report(self, req: mpb.ReportMetricsRequest) -> int:
        run = await self.store.get_run(req.run_id)
        check_rows(req.rows, run.config.policies)
        top = max(row.round for row in req.rows)
        i = next(i for i, row in enumerate(req.rows) if row.round == top)
        await self.store.runs.check_round(req.run_id, top, f"rows[{i}].round")
        ret = self.store.retention(run)
        key = stream_key(self.store.keys(req.run_id))
        now = int(time.time() * 1000)
        async with redis_op("report_metrics"), \
                self.store.r.pipeline(transaction=True) as pipe:
            for row in req.rows:
                fields = {"p": row.policy_id, "r": row.round, "t": row.unix_ms or now,
                          "v": values_json(row)}
                pipe.xadd(key, fields, maxlen=ret.max_stream_len,
                          approximate=True)
            pipe.expire(key, ret.ttl_seconds)
            queue_round(pipe, self.store.keys(req.run_id), top, ret.ttl_seconds)
            await pipe.execute()
        self.store.runs.raised_round(req.run_id, top)
        return len(req.rows)

    async def read(self, run_id: str, *, policy: str | None = None, after: str | None = None,
                   limit: int = 1000, scan_budget: int = 20_000, budget: int | None = None
                   ) -> tuple[list[Row], str, bool]:
        """Rows after `after` (exclusive) in report order, optionally of one policy.

        Returns (rows, cursor, more): pass `cursor` as the next `after`; `more` is true when the
        page stopped at `limit` rows, at `scan_budget` entries examined or at `budget` bytes of
        answer (None: the answer's budget; read again at once rather than waiting: more rows
        may be stored already)."""
        run = await self.store.get_run(run_id)
        if policy is not None and policy not in run.config.policies:
            # A well-formed name the run lacks: nothing to find (404), like an unknown run.
            raise NotFound("policy", f"{quote(policy)} is not a policy of run {quote(run_id)}")
        if after:
            check_stream_id(after, "after")
        if not 1 <= limit <= 10_000:
            raise InvalidArgument("limit", "must lie in [1, 10000]")
        key = stream_key(self.store.keys(run_id))
        pos = after or "0-0"
        if is_last_id(pos):
            return [], pos, False
        rows: list[Row] = []
        scanned = 0
        limit_bytes = self.store.cfg.limits.max_response_bytes if budget is None else budget
        room = Budget(limit_bytes)
        # Sized before it is read: a chunk of entries is at most the answer's budget.
        chunk = max(1, min(limit, 10_000, limit_bytes // (MAX_ROW_BYTES + _ROW_BYTES)))
        while True:
            async with redis_op("read_metrics"):
                entries: Any = await self.store.r.xrange(key, min=f"({pos}", max="+",
                                                         count=chunk)
            for eid, fields in entries:
                sid = eid.decode() if isinstance(eid, bytes) else eid
                pol = fields[b"p"].decode()
                if (policy is None or pol == policy) and not room.take(
                        len(fields[b"v"]) + len(pol) + _ROW_BYTES):
                    m.PAGES_CUT.labels("metrics").inc()
                    return rows, pos, True
                pos = sid
                scanned += 1
                if policy is not None and pol != policy:
                    continue
                rows.append(Row(cursor=pos, policy_id=pol, round=int(fields[b"r"]),
                                unix_ms=int(fields[b"t"]), values=json.loads(fields[b"v"])))
                if len(rows) >= limit:
                    return rows, pos, True
            if len(entries) < chunk:
                return rows, pos, False
            if scanned >= scan_budget:
                return rows, pos, True
