"""GetRoundStats: pooled REWARD_STATS of a round, waiting for expected peers, in pages.

A page covers the request's prompts from where the previous page ended (`page_token`), at most
`MAX_PAGE_FIELDS` prompt x policy entries read at once and as many prompts as fit the answer's
byte budget. What is read back is held to the record rules again (`validate.check_stats`): an
entry stored before a rule existed (a count of 2^63 - 1 once passed) is left out of its prompt,
counted in `mutualrl_see_stored_refused_total`, and never stops the round's other entries from
being answered. Pooling sums in Python integers and `math.fsum`: with every entry in bounds the
pool is finite and its count far below 2^63.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from mutualrl.common.errors import InvalidArgument
from mutualrl.common.records import check_stats
from mutualrl.see import metrics as m
from mutualrl.see.store.entries import redis_op
from mutualrl.see.store.layout import as_str
from mutualrl.see.store.paging import Budget, make_token, read_index, request_digest
from mutualrl.see.store.part import StorePart
from mutualrl.v1 import experience_pb2 as pb

log = logging.getLogger(__name__)

MAX_PAGE_FIELDS = 65_536
"""Prompt x policy entries one page reads at most."""
_PROMPT_BYTES = 8
"""What a PromptStats adds to its prompt id and entries in an answer (tags, lengths)."""
_ENTRY_BYTES = 48
"""What a PolicyStats adds to its policy id: the four stats fields and their framing."""


def parse_stats(raw: bytes | str) -> pb.RewardStats | None:
    """A stored "count,sum,sum_sq,max[,success_max]" entry, or None when it breaks the record
    rules."""
    try:
        c, sm, ss, mx, *rest = as_str(raw).split(",")
        count, total, sum_sq, top = int(c), float(sm), float(ss), float(mx)
        if len(rest) > 1:
            return None
        success = float(rest[0]) if rest else None
        check_stats(count, total, sum_sq, top, "stats", success)
    except (ValueError, InvalidArgument):
        return None
    return pb.RewardStats(count=count, sum=total, sum_sq=sum_sq, max=top, success_max=success)


def success_max(stats: pb.RewardStats) -> float:
    """The largest success reward the stats vouch for: `success_max`, else `max`."""
    return stats.success_max if stats.HasField("success_max") else stats.max


def pool(entries: list[pb.RewardStats]) -> pb.RewardStats:
    """The sum of `entries` (count, sum, sum_sq), their max, and their success max when any
    carries one (those without count their max)."""
    if not entries:
        return pb.RewardStats()
    out = pb.RewardStats(count=sum(e.count for e in entries),
                         sum=math.fsum(e.sum for e in entries),
                         sum_sq=math.fsum(e.sum_sq for e in entries),
                         max=max(e.max for e in entries))
    if any(e.HasField("success_max") for e in entries):
        out.success_max = max(map(success_max, entries))
    return out


class RoundStats(StorePart):
    async def round_stats(self, req: pb.RoundStatsRequest, deadline: float | None = None
                          ) -> pb.RoundStatsResponse:
        """One page of the pooled REWARD_STATS of a round; waits (polling) for expected
        policies on the page's prompts until wait_ms or `deadline` (monotonic seconds) passes,
        then returns what exists."""
        run = await self.runs.get(req.run_id)
        policies = list(run.config.policies)
        expected = list(req.expect_policies) or policies
        prompts = list(dict.fromkeys(req.prompt_ids))
        digest = request_digest(req.run_id, req.round, prompts)
        start = read_index(req.page_token, digest, len(prompts))
        page = prompts[start:start + max(1, MAX_PAGE_FIELDS // len(policies))]
        fields = [f"{p}|{pol}" for p in page for pol in policies]
        key = self.runs.keys(req.run_id).round_stats(req.round)
        t0 = time.monotonic()
        stop_at = t0 + min(req.wait_ms, self.cfg.max_wait_ms) / 1000
        if deadline is not None:
            stop_at = min(stop_at, deadline)
        poll = self.cfg.poll_interval_ms / 1000
        while True:
            async with redis_op("round_stats"):
                values = await self.r.hmget(key, fields)
            have = {f: v for f, v in zip(fields, values, strict=True) if v is not None}
            missing = sorted({pol for p in page for pol in expected
                              if f"{p}|{pol}" not in have})
            now = time.monotonic()
            if not missing or now >= stop_at or self.stopping.is_set():
                break
            await asyncio.sleep(min(poll, max(0.0, stop_at - now)))
        m.ROUND_STATS_WAIT.observe(time.monotonic() - t0)
        resp = pb.RoundStatsResponse()
        room = Budget(self.cfg.limits.max_response_bytes)
        taken: dict[tuple[str, int], int] = {}
        answered: list[str] = []
        for p in page:
            ps = pb.PromptStats(prompt_id=p)
            for pol in () if req.wait_only else policies:  # a wait reads nothing
                raw = have.get(f"{p}|{pol}")
                if raw is None:
                    continue
                st = parse_stats(raw)
                if st is None:
                    m.STORED_REFUSED.labels("REWARD_STATS").inc()
                    log.warning("run %s round %d: the stored REWARD_STATS of %s on a prompt "
                                "breaks the record rules; left out", req.run_id, req.round, pol)
                    continue
                ps.policies.add(policy_id=pol, stats=st)
            ps.pooled.CopyFrom(pool([e.stats for e in ps.policies]))
            size = len(p.encode()) + _PROMPT_BYTES + sum(
                len(e.policy_id) + _ENTRY_BYTES for e in ps.policies)
            if not room.take(size):
                break
            resp.prompts.append(ps)
            answered.append(p)
            for e in ps.policies:
                if req.policy_id and e.policy_id != req.policy_id:
                    taken[(e.policy_id, req.round)] = taken.get((e.policy_id, req.round), 0) + 1
        done = start + len(answered)
        if done < len(prompts):
            m.PAGES_CUT.labels("round_stats").inc()
            resp.next_page_token = make_token(digest, str(done))
        answered_set = set(answered)
        missing = sorted({pol for p in answered_set for pol in expected
                          if f"{p}|{pol}" not in have})
        resp.complete = not missing
        resp.missing_policies.extend(missing)
        n_out = sum(taken.values())
        if taken:
            async with redis_op("round_stats"):
                await self._count_transfers(req.run_id, req.policy_id, pb.REWARD_STATS, taken)
        m.RECORDS_OUT.labels("REWARD_STATS", "round_stats").inc(n_out)
        return resp
