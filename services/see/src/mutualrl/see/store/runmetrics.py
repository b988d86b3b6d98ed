"""Per-round metrics of a run's trainers, kept in the run's Redis keys (run_metrics.proto).

Trainers report one row per (policy, round) over gRPC (`RunMetrics.ReportMetrics`); people read
them through REST (`GET /v1/runs/{run}/metrics`, the dashboard's live curves). Rows are appended
to one stream per run, `<prefix>:{<run>}:metrics` (fields p = policy, r = round, t = Unix ms,
v = the values as JSON), capped like the record streams (the run's `max_stream_len`) and
expiring with the run (its `ttl_seconds`, refreshed on every write). A round reported again (a
resumed trainer runs it again) is a new entry: readers keep the latest row per (policy, round).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mutualrl.common.errors import InvalidArgument, NotFound, quote, require_nonnegative
from mutualrl.see.keys import RunKeys
from mutualrl.see.store import SeeStore
from mutualrl.see.store.entries import check_stream_id, is_last_id, redis_op
from mutualrl.v1 import run_metrics_pb2 as mpb

MAX_ROWS = 1024
MAX_VALUES = 512
MAX_NAME_CHARS = 128


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
        require_nonnegative(f"{where}.round", row.round)
        require_nonnegative(f"{where}.unix_ms", row.unix_ms)
        if len(row.values) > MAX_VALUES:
            raise InvalidArgument(f"{where}.values", f"at most {MAX_VALUES} entries")
        for name, value in row.values.items():
            if not 1 <= len(name) <= MAX_NAME_CHARS or not name.isprintable():
                raise InvalidArgument(f"{where}.values", f"name {quote(name)} must be 1-"
                                      f"{MAX_NAME_CHARS} printable characters")
            if not math.isfinite(value):
                raise InvalidArgument(f"{where}.values[{name}]", "not finite")


class RunMetricsStore:
    """Metric rows over the SEE store's Redis client and run registry."""

    def __init__(self, store: SeeStore) -> None:
        self.store = store

    async def report(self, req: mpb.ReportMetricsRequest) -> int:
        run = await self.store.get_run(req.run_id)
        check_rows(req.rows, run.config.policies)
        ret = self.store.retention(run)
        key = stream_key(self.store.keys(req.run_id))
        now = int(time.time() * 1000)
        async with redis_op("report_metrics"), \
                self.store.r.pipeline(transaction=True) as pipe:
            for row in req.rows:
                fields = {"p": row.policy_id, "r": row.round, "t": row.unix_ms or now,
                          "v": json.dumps(dict(row.values), separators=(",", ":"))}
                pipe.xadd(key, fields, maxlen=ret.max_stream_len,
                          approximate=True)
            pipe.expire(key, ret.ttl_seconds)
            await pipe.execute()
        return len(req.rows)

    async def read(self, run_id: str, *, policy: str | None = None, after: str | None = None,
                   limit: int = 1000, scan_budget: int = 20_000) -> tuple[list[Row], str, bool]:
        """Rows after `after` (exclusive) in report order, optionally of one policy.

        Returns (rows, cursor, more): pass `cursor` as the next `after`; `more` is true when the
        page stopped at `limit` rows or at `scan_budget` entries examined (read again at once
        rather than waiting: more rows may be stored already)."""
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
        chunk = min(max(limit, 256), 10_000)
        while True:
            async with redis_op("read_metrics"):
                entries: Any = await self.store.r.xrange(key, min=f"({pos}", max="+",
                                                         count=chunk)
            for eid, fields in entries:
                pos = eid.decode() if isinstance(eid, bytes) else eid
                scanned += 1
                pol = fields[b"p"].decode()
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
