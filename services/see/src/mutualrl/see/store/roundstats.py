"""GetRoundStats: pooled REWARD_STATS of a round, waiting for expected peers."""

from __future__ import annotations

import asyncio
import time

from mutualrl.see import metrics as m
from mutualrl.see.store.entries import redis_op
from mutualrl.see.store.layout import as_str
from mutualrl.see.store.part import StorePart
from mutualrl.v1 import experience_pb2 as pb


class RoundStats(StorePart):
    async def round_stats(self, req: pb.RoundStatsRequest, deadline: float | None = None
                          ) -> pb.RoundStatsResponse:
        """Pooled REWARD_STATS of a round; waits (polling) for expected policies until wait_ms
        or `deadline` (monotonic seconds) passes, then returns what exists."""
        run = await self.runs.get(req.run_id)
        policies = list(run.config.policies)
        expected = list(req.expect_policies) or policies
        prompts = list(dict.fromkeys(req.prompt_ids))
        fields = [f"{p}|{pol}" for p in prompts for pol in policies]
        key = self.runs.keys(req.run_id).round_stats(req.round)
        start = time.monotonic()
        stop_at = start + min(req.wait_ms, self.cfg.max_wait_ms) / 1000
        if deadline is not None:
            stop_at = min(stop_at, deadline)
        poll = self.cfg.poll_interval_ms / 1000
        while True:
            async with redis_op("round_stats"):
                values = await self.r.hmget(key, fields)
            have = {f: v for f, v in zip(fields, values, strict=True) if v is not None}
            missing = sorted({pol for p in prompts for pol in expected
                              if f"{p}|{pol}" not in have})
            now = time.monotonic()
            if not missing or now >= stop_at or self.stopping.is_set():
                break
            await asyncio.sleep(min(poll, max(0.0, stop_at - now)))
        m.ROUND_STATS_WAIT.observe(time.monotonic() - start)
        resp = pb.RoundStatsResponse(complete=not missing, missing_policies=missing)
        taken: dict[tuple[str, int], int] = {}
        for p in prompts:
            ps = resp.prompts.add(prompt_id=p)
            pooled = ps.pooled
            first = True
            for pol in policies:
                raw = have.get(f"{p}|{pol}")
                if raw is None:
                    continue
                c, sm, ss, mx = as_str(raw).split(",")
                st = pb.RewardStats(count=int(c), sum=float(sm), sum_sq=float(ss), max=float(mx))
                ps.policies.add(policy_id=pol, stats=st)
                pooled.count += st.count
                pooled.sum += st.sum
                pooled.sum_sq += st.sum_sq
                pooled.max = st.max if first else max(pooled.max, st.max)
                first = False
                if req.policy_id and pol != req.policy_id:
                    taken[(pol, req.round)] = taken.get((pol, req.round), 0) + 1
        n_out = sum(taken.values())
        if taken:
            async with redis_op("round_stats"):
                await self._count_transfers(req.run_id, req.policy_id, pb.REWARD_STATS, taken)
        m.RECORDS_OUT.labels("REWARD_STATS", "round_stats").inc(n_out)
        return resp
