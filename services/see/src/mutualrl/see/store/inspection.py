"""Reading a run back: Subscribe (live events in id order), run statistics, one record, and
the REST listing of records with filters and a cursor.

Each read sizes the records it would return from their index entries before it loads them: a
listing page ends early at the answer's byte budget (its cursor goes on after the last record
given), Subscribe reads the payloads of what one XREAD returned a budget at a time, and the run
statistics page their transfer counts."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass

from mutualrl.common.errors import InvalidArgument, NotFound, quote
from mutualrl.see import metrics as m
from mutualrl.see.keys import KINDS, RunKeys, kind_name
from mutualrl.see.store.entries import check_stream_id, is_last_id, redis_op
from mutualrl.see.store.layout import Header, as_str, parse_index_entry, stream_id_key
from mutualrl.see.store.paging import Budget, make_token, read_token, request_digest
from mutualrl.see.store.part import StorePart
from mutualrl.v1 import experience_pb2 as pb

TRANSFER_BYTES = 32
"""What a TransferCount adds to its two policy ids in an answer (kind, count, framing)."""


@dataclass
class RecordPage:
    """One page of the REST record listing."""

    records: list[tuple[str, pb.ExperienceRecord]]
    next_cursor: str | None
    scanned: int


class Inspection(StorePart):
    async def subscribe(self, req: pb.SubscribeRequest, block_ms: int = 500
                        ) -> AsyncGenerator[pb.ExperienceEvent, None]:
        """Live events in stream-id order; ends when the store stops (or the caller cancels)."""
        await self.runs.get(req.run_id)
        kinds: list[int] = [int(k) for k in dict.fromkeys(req.kinds)] or list(KINDS)
        rk = self.runs.keys(req.run_id)
        if req.after_id:
            start = req.after_id
        else:
            async with redis_op("subscribe"):
                last = await self._get(rk.lastid)
            start = as_str(last) if last else "0-0"
        positions = {rk.stream(k): start for k in kinds}
        while not self.stopping.is_set():
            async with redis_op("subscribe"):
                async with self.blocking.slot("run_id", wait=True) as client:
                    reply = await self._xread(positions, 512, block_ms, client)
                if reply and len(positions) > 1:
                    # A blocked XREAD wakes up with the one stream that got data first; read the
                    # others now (one atomic snapshot) so a batch comes out in id order.
                    seen = {as_str(stream): entries for stream, entries in reply}
                    rest = {k: (as_str(seen[k][-1][0]) if k in seen else v)
                            for k, v in positions.items()}
                    reply = reply + await self._xread(rest, 512)
            found: list[tuple[tuple[int, int], str, str]] = []
            for stream, entries in reply:
                name = as_str(stream)
                for eid, fields in entries:
                    sid = as_str(eid)
                    positions[name] = max(positions[name], sid, key=stream_id_key)
                    found.append((stream_id_key(sid), sid, Header.of(fields).record_id))
            if not found:
                continue
            found.sort()
            async with redis_op("subscribe"):
                locs = await self.locate(rk, [f[2] for f in found])
            for part in self._budgeted(locs):
                async with redis_op("subscribe"):
                    payloads = await self.payloads_at(rk, [found[i][2] for i in part],
                                                      [locs[i] for i in part])
                for i, payload in zip(part, payloads, strict=True):
                    if payload is None:
                        continue
                    ev = pb.ExperienceEvent(event_id=found[i][1])
                    ev.record.ParseFromString(payload)
                    m.RECORDS_OUT.labels(kind_name(ev.record.kind), "subscribe").inc()
                    yield ev

    def _budgeted(self, locs: list[bytes | None]) -> list[list[int]]:
        """Positions of `locs` in runs whose records fit one answer's budget each."""
        parts: list[list[int]] = [[]]
        room = Budget(self.cfg.limits.max_response_bytes)
        for i, loc in enumerate(locs):
            if loc is None:
                continue
            if not room.take(self.size_of(loc)):
                parts.append([])
                room = Budget(self.cfg.limits.max_response_bytes)
                room.take(self.size_of(loc))
            parts[-1].append(i)
        return [p for p in parts if p]

    async def run_stats(self, run_id: str, page_token: str = "", budget: int | None = None
                        ) -> pb.RunStats:
        """The run's counts, and the page of its transfer counts that starts after
        `page_token`'s (taker, source, kind), in that order, within the byte budget."""
        run = await self.runs.get(run_id)
        rk = self.runs.keys(run_id)
        async with redis_op("run_stats"), self.r.pipeline(transaction=False) as pipe:
            pipe.hgetall(rk.counts)
            pipe.hgetall(rk.xfer)
            pipe.hgetall(rk.trimmed)
            for k in KINDS:
                pipe.xlen(rk.stream(k))
            counts, xfer, trimmed, *lens = await pipe.execute()
        out = pb.RunStats(run_id=run_id)
        per_policy: dict[str, dict[str, int]] = {p: {} for p in run.config.policies}
        for fld, val in counts.items():
            name = as_str(fld)
            if name == "!dup":
                out.duplicates = int(val)
                continue
            policy, _, kind = name.rpartition("|")
            per_policy.setdefault(policy, {})[kind_name(int(kind))] = int(val)
        for policy, kinds in per_policy.items():
            pc = out.policies.add(policy_id=policy)
            for k in KINDS:
                pc.published[kind_name(k)] = kinds.get(kind_name(k), 0)
        for fld, val in trimmed.items():
            out.trimmed[as_str(fld)] = int(val)
        for k, n in zip(KINDS, lens, strict=True):
            out.stream_lengths[kind_name(k)] = int(n)
        digest = request_digest(run_id)
        position = read_token(page_token, digest)
        after = None if position is None else tuple(position.split("|"))
        room = Budget(self.cfg.limits.max_response_bytes if budget is None else budget)
        room.take(out.ByteSize())
        given = sorted((tuple(as_str(fld).split("|")), int(val)) for fld, val in xfer.items())
        for (taker, source, kind), val in given:
            if after is not None and (taker, source, kind) <= after:
                continue
            size = len(taker) + len(source) + TRANSFER_BYTES
            if not room.take(size):
                if out.transfers:
                    m.PAGES_CUT.labels("run_stats").inc()
                    last = out.transfers[-1]
                    out.next_page_token = make_token(digest, f"{last.taker_policy}|"
                                                     f"{last.source_policy}|{last.kind}")
                    break
                room.force(size)  # a page always moves on
            out.transfers.add(taker_policy=taker, source_policy=source, kind=int(kind),
                              count=val)
        return out

    async def get_record(self, run_id: str, record_id: str) -> tuple[str, pb.ExperienceRecord]:
        await self.runs.get(run_id)
        if not record_id:
            raise InvalidArgument("record_id", "required")
        rk = self.runs.keys(run_id)
        async with redis_op("get_record"):
            loc = await self.r.hget(rk.idx, record_id)
            if loc is None:
                raise NotFound("record_id", f"record {quote(record_id)} not found in run "
                                            f"{quote(run_id)}")
            sid = parse_index_entry(loc).stream_id
            payload, = await self.payloads_at(rk, [record_id], [loc])
        if payload is None:
            raise NotFound("record_id", f"record {quote(record_id)} was removed by retention")
        return sid, pb.ExperienceRecord.FromString(payload)

    async def list_records(self, run_id: str, *, kinds: Iterable[int] = KINDS,
                           policy: str | None = None, prompt: str | None = None,
                           round_min: int | None = None, round_max: int | None = None,
                           verified: bool | None = None, cursor: str | None = None,
                           limit: int = 100, scan_budget: int = 20_000) -> RecordPage:
        """Records in stream-id order across the selected kinds, after `cursor` (exclusive).

        Filters run on the entries' plain fields; at most `scan_budget` entries are examined
        per call, so a sparse filter returns a short page with a cursor to continue from.
        """
        await self.runs.get(run_id)
        if cursor:
            check_stream_id(cursor, "cursor")
        if not 1 <= limit <= 1000:
            raise InvalidArgument("limit", "must lie in [1, 1000]")
        rk = self.runs.keys(run_id)
        streams = [rk.stream(k) for k in dict.fromkeys(kinds)]
        chunk = min(max(limit * 2, 64), 1024)
        pos = cursor or "0-0"
        out: list[tuple[str, str]] = []
        scanned = 0
        if is_last_id(pos):
            return RecordPage([], None, 0)
        while True:
            async with redis_op("list_records"), self.r.pipeline(transaction=False) as pipe:
                for stream in streams:
                    pipe.xrange(stream, min=f"({pos}", max="+", count=chunk)
                replies = await pipe.execute()
            # Entries of the streams merged by id; only up to the smallest last id of a full
            # chunk is complete (a shorter stream may still hold entries beyond it).
            bound: tuple[int, int] | None = None
            merged: list[tuple[tuple[int, int], str, dict[bytes, bytes]]] = []
            for entries in replies:
                for eid, fields in entries:
                    sid = as_str(eid)
                    a, b = sid.split("-")
                    merged.append(((int(a), int(b)), sid, fields))
                if len(entries) == chunk:
                    a, b = as_str(entries[-1][0]).split("-")
                    last = (int(a), int(b))
                    bound = last if bound is None or last < bound else bound
            merged.sort(key=lambda x: x[0])
            exhausted = bound is None
            for key, sid, fields in merged:
                if bound is not None and key > bound:
                    break
                scanned += 1
                pos = sid
                h = Header.of(fields)
                if policy is not None and h.policy_id != policy:
                    continue
                if prompt is not None and h.prompt_id != prompt:
                    continue
                if (round_min is not None and h.round < round_min) or \
                        (round_max is not None and h.round > round_max):
                    continue
                if verified is not None and h.verified != verified:
                    continue
                out.append((sid, h.record_id))
                if len(out) >= limit:
                    return await self._page(rk, out, sid, scanned)
            if exhausted:
                return await self._page(rk, out, None, scanned)
            if scanned >= scan_budget:
                return await self._page(rk, out, pos, scanned)

    async def _page(self, rk: RunKeys, found: list[tuple[str, str]], cursor: str | None,
                    scanned: int, budget: int | None = None) -> RecordPage:
        """Fetch the payloads of a page's records, as many as fit `budget` bytes (None: the
        answer's budget); a page cut short goes on after its last record."""
        async with redis_op("list_records"):
            locs = await self.locate(rk, [rid for _, rid in found])
            room = Budget(self.cfg.limits.max_response_bytes if budget is None else budget)
            n = 0
            for loc in locs:
                if loc is not None and not room.take(self.size_of(loc)):
                    break
                n += 1
            if n < len(found):
                m.PAGES_CUT.labels("list_records").inc()
                cursor = found[n - 1][0]
            payloads = await self.payloads_at(rk, [rid for _, rid in found[:n]], locs[:n])
        return RecordPage([(sid, pb.ExperienceRecord.FromString(pl))
                           for (sid, _), pl in zip(found[:n], payloads, strict=True)
                           if pl is not None], cursor, scanned)
