"""Probe `sapo`: peers' whole groups of completions join as groups of their own (docs/design.md
(13)), rescored by this policy's own reward functions, trained without an importance weight."""

from __future__ import annotations

import random

import torch

from mutualrl.trainer.algos.sapo import chosen_groups, source_groups
from mutualrl.trainer.data.dataset_task import score_round
from mutualrl.trainer.engines.base import Sample
from mutualrl.trainer.sharing.exchange import PeerExchange, PeerRollout
from mutualrl.trainer.sharing.probes.base import LossInputs, PeerRows, RoundData
from mutualrl.trainer.sharing.probes.prp import RolloutProbe, flatten

WHOLE = 1 << 30  # no cap on a peer's rollouts per prompt: its whole group joins


class SAPOProbe(RolloutProbe):
    kind = "sapo"

    def cap(self) -> int:
        return WHOLE

    def build(self, data: RoundData, ex: PeerExchange,
              per_prompt: dict[int, list[PeerRollout]], stats: dict[str, float]) -> LossInputs:
        chosen, prompt_index = flatten(per_prompt)
        ends = [r.stopped_by_eos for r in chosen]
        token_ids = ex.retokenize([r.text for r in chosen], ends) if chosen else []
        rewards = self.rescore(data, chosen, prompt_index, token_ids)
        own_adv, peer_adv = self.advantages(data, per_prompt, rewards=rewards)
        rescue = self.diagnose(data, per_prompt, peer_adv, stats, rewards)
        # One group per (prompt, peer); which of them join (SAPO's drop and draw).
        groups = [(i, idx) for i in sorted(per_prompt)
                  for idx in source_groups([r.policy for r in per_prompt[i]]).values()]
        rng = random.Random(f"sapo:{self.policy}:{data.round}")
        live = chosen_groups([peer_adv[i][idx] for i, idx in groups], self.settings, rng)
        stats["sapo_groups"] = float(sum(live))
        stats["sapo_groups_dropped"] = float(len(live) - sum(live))
        offset = {i: sum(len(per_prompt[k]) for k in sorted(per_prompt) if k < i)
                  for i in per_prompt}
        keep = sorted(offset[i] + j for (i, idx), ok in zip(groups, live, strict=True)
                      if ok for j in idx)
        stats["peer_samples"] = float(len(keep))
        if not keep:
            return LossInputs(advantages=own_adv, stats=stats)
        flat_adv = torch.cat([peer_adv[i] for i in sorted(per_prompt)])
        peers = PeerRows(
            prompt_index=[prompt_index[k] for k in keep],
            token_ids=[token_ids[k] for k in keep],
            advantages=flat_adv[keep],
            sender_logp_sum=torch.zeros(len(keep), dtype=torch.float64),
            method=self.kind,
            rescue=rescue[keep],
        )
        return LossInputs(advantages=own_adv, peers=peers, stats=stats)

    def rescore(self, data: RoundData, chosen: list[PeerRollout], prompt_index: list[int],
                token_ids: list[list[int]]) -> dict[int, list[float]] | None:
        """Each prompt's peer rewards by this policy's own reward functions (the task), on
        the peers' texts in its own tokens; None without a task (the senders' rewards)."""
        if self.task is None or not chosen:
            return None
        samples = [[Sample(prompt_index=0, token_ids=ids, text=r.text, offsets=[], logprobs=[],
                           finish_reason="length" if r.truncated else "stop")]
                   for r, ids in zip(chosen, token_ids, strict=True)]
        scored = score_round(self.task, [data.prompts[i] for i in prompt_index], samples,
                             self.settings.tau)
        out: dict[int, list[float]] = {}
        for i, row in zip(prompt_index, scored.rewards, strict=True):
            out.setdefault(i, []).append(float(row[0]))
        return out
