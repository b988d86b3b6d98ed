"""Peer ROLLOUTs through one Redis Streams consumer group per policy: fetch (own pending
entries first, then idle ones of gone consumers, then new ones) and ack."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import cast

from redis import exceptions as rexc

from mutualrl.see import metrics as m
from mutualrl.see.keys import RunKeys
from mutualrl.see.store.entries import Entry, redis_op
from mutualrl.see.store.layout import Header, as_str
from mutualrl.see.store.paging import Budget
from mutualrl.see.store.part import StorePart
from mutualrl.v1 import experience_pb2 as pb

DELIVERY_BYTES = 96
"""What a Delivery adds to its record in an answer (its id, count and framing), at most."""


class Rollouts(StorePart):
    async def _ensure_group(self, stream: str, group: str) -> None:
        with contextlib.suppress(rexc.ResponseError):  # BUSYGROUP: someone else made it
            await self.r.xgroup_create(stream, group, id="0", mkstream=True)

    async def fetch_rollouts(self, req: pb.FetchRolloutsRequest, deadline: float | None = None
                             ) -> pb.FetchRolloutsResponse:
        """Pending (unacknowledged) entries of this consumer first, then claimed idle ones of
        dead consumers, then new ones; own and stale entries are acknowledged and skipped.
        `req` passed `requests.check_fetch`."""
        stream = self.runs.keys(req.run_id).stream(pb.ROLLOUT)
        group, consumer, me = req.policy_id, req.consumer, req.policy_id
        min_round = req.current_round - req.max_round_lag if req.current_round >= 0 else None
        out = pb.FetchRolloutsResponse()
        to_ack: list[str] = []
        taken: dict[tuple[str, int], int] = {}
        chosen: list[tuple[str, str, int, bool, str]] = []

        def keep(entry_id: str, fields: dict[bytes, bytes] | None, count: int,
                 fresh: bool) -> None:
            if fields is None:  # trimmed by retention while pending: nothing left to give
                to_ack.append(entry_id)
                return
            h = Header.of(fields)
            source = h.policy_id
            if source == me:
                to_ack.append(entry_id)
                return
            if (min_round is not None and h.round < min_round) or \
                    h.policy_version < req.min_policy_version:
                to_ack.append(entry_id)
                out.skipped_stale += 1
                return
            chosen.append((entry_id, h.record_id, count, fresh, source))

        async with redis_op("fetch_rollouts"):
            # 1. Our own pending list: what we were given before a restart and never acked.
            try:
                pending = await self._xreadgroup(group, consumer, stream, "0", req.max_records)
            except rexc.ResponseError as err:
                if "NOGROUP" not in str(err):
                    raise
                await self._ensure_group(stream, group)
                pending = []
            if pending:
                eids = [as_str(e[0]) for e in pending]
                counts = await self._pending_counts(stream, group, consumer, eids[0], eids[-1],
                                                    len(eids))
                for eid, (_, fields) in zip(eids, pending, strict=True):
                    keep(eid, fields or None, counts.get(eid, 1), False)
            # 2. Entries of consumers that went away (same policy, idle past claim_idle_ms).
            room = req.max_records - len(chosen)
            if room > 0 and req.claim_idle_ms > 0:
                claimed = await self.r.xautoclaim(stream, group, consumer, req.claim_idle_ms,
                                                  start_id="0-0", count=room)
                # XAUTOCLAIM: [next start id, entries, deleted ids]
                entries = cast("list[Entry]", claimed[1]) if claimed else []
                if entries:
                    eids = [as_str(e[0]) for e in entries]
                    counts = await self._pending_counts(stream, group, consumer, min(eids),
                                                        max(eids), len(eids) * 4)
                    for eid, (_, fields) in zip(eids, entries, strict=True):
                        keep(eid, fields or None, counts.get(eid, 2), False)
            # 3. New entries; skipped ones do not count, so read on while they fill the page.
            block_ms = req.block_ms
            for _ in range(16):
                room = req.max_records - len(chosen)
                if room <= 0:
                    break
                block = None
                if not chosen and block_ms > 0:
                    block = block_ms
                    if deadline is not None:
                        block = max(1, min(block, int((deadline - time.monotonic()) * 1000)))
                try:
                    if block is None:
                        entries = await self._xreadgroup(group, consumer, stream, ">", room)
                    else:
                        async with self.blocking.slot("block_ms", wait=False) as client:
                            entries = await self._xreadgroup(group, consumer, stream, ">", room,
                                                             block, client)
                except rexc.ResponseError as err:
                    if "NOGROUP" not in str(err):
                        raise
                    await self._ensure_group(stream, group)
                    continue
                if not entries:
                    break
                for raw_id, fields in entries:
                    keep(as_str(raw_id), fields, 1, True)
                block_ms = 0  # block at most once per call
            rk = self.runs.keys(req.run_id)
            nbytes = 0
            budget = self.cfg.limits.max_response_bytes
            found, out.more = await self._budgeted_payloads(rk, chosen, budget)
            for (eid, _, count, fresh, source), payload in found:
                if payload is None:  # the record's payload expired (TTL) or was trimmed
                    to_ack.append(eid)
                    continue
                d = out.deliveries.add(delivery_id=eid, delivery_count=count)
                d.record.ParseFromString(payload)
                nbytes += len(payload)
                if fresh:
                    key = (source, d.record.round)
                    taken[key] = taken.get(key, 0) + 1
            m.BYTES_OUT.labels("ROLLOUT").inc(nbytes)
            if to_ack:
                await self.r.xack(stream, group, *to_ack)
            if taken:
                await self._count_transfers(req.run_id, me, pb.ROLLOUT, taken)
        m.RECORDS_OUT.labels("ROLLOUT", "fetch").inc(len(out.deliveries))
        return out

    async def _budgeted_payloads(self, rk: RunKeys,
                                 chosen: list[tuple[str, str, int, bool, str]], budget: int
                                 ) -> tuple[list[tuple[tuple[str, str, int, bool, str],
                                                       bytes | None]], bool]:
        """Payloads of the chosen entries that fit `budget` bytes of answer (at least one
        record), and whether any was left out. Sized from the index before anything is read,
        so a fetch holds at most its answer whatever max_records asks. Entries left out stay
        pending for this consumer and come first in its next fetch."""
        locs = await self.locate(rk, [c[1] for c in chosen])
        room = Budget(budget)
        kept: list[int] = []
        for i, loc in enumerate(locs):
            if loc is not None and not room.take(self.size_of(loc) + DELIVERY_BYTES):
                break
            kept.append(i)
        more = len(kept) < len(chosen)
        found = await self.payloads_at(rk, [chosen[i][1] for i in kept], [locs[i] for i in kept])
        return [(chosen[i], payload) for i, payload in zip(kept, found, strict=True)], more

    async def ack(self, run_id: str, policy_id: str, delivery_ids: Sequence[str]) -> int:
        """Acknowledge deliveries (validated by `requests.check_ack`)."""
        if not delivery_ids:
            return 0
        async with redis_op("ack"):
            return int(await self.r.xack(self.runs.keys(run_id).stream(pb.ROLLOUT), policy_id,
                                         *delivery_ids))
