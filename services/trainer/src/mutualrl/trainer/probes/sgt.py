"""Probe `sgt`: success-gated transfer of verified peer successes on prompts this policy fails."""

from __future__ import annotations

from mutualrl.trainer.algos.sgt import rescue_set
from mutualrl.trainer.exchange import PeerExchange
from mutualrl.trainer.probes.base import (
    Demos,
    LossInputs,
    Probe,
    RoundData,
    grpo_inputs,
    index_of,
    own_max,
)


class SGTProbe(Probe):
    kind = "sgt"

    def gather(self, data: RoundData, ex: PeerExchange, deadline: float) -> LossInputs:
        s = self.settings
        mine = own_max(data)
        failed = [pid for pid, r in mine.items() if r < s.tau]
        plan = grpo_inputs(data)
        plan.stats = {"rescued_prompts": 0.0, "rescue_demos": 0.0, "candidates": 0.0}
        if not failed:
            return plan
        # Round stats carry each peer's max reward: a bounded wait for peers of this round,
        # then successes are fetched only for prompts some peer solved.
        _, peer_best, complete = ex.peer_stats(data.round, failed, deadline)
        plan.stats["fallback"] = float(not complete and not peer_best)
        solved = [pid for pid in failed if peer_best.get(pid, float("-inf")) >= s.tau]
        candidates = ex.peer_successes(
            solved, data.round - s.max_staleness_rounds, s.sgt_max_per_prompt, deadline)
        rescued = rescue_set(mine, candidates, self.policy, s.tau, s.sgt_max_per_prompt)
        plan.stats["candidates"] = float(len(candidates))
        if not rescued:
            return plan
        where = index_of(data.prompts)
        pids = [pid for pid, texts in rescued.items() for _ in texts]
        texts = [t for ts in rescued.values() for t in ts]
        token_ids = ex.retokenize(texts)
        plan.demos = Demos(prompt_index=[where[p] for p in pids], token_ids=token_ids)
        plan.stats["rescued_prompts"] = float(len(rescued))
        plan.stats["rescue_demos"] = float(len(texts))
        for pid in rescued:  # per skill: which skills peers unlock (the dashboard's bars)
            key = f"rescued/{data.prompts[where[pid]].skill}"
            plan.stats[key] = plan.stats.get(key, 0.0) + 1.0
        return plan
