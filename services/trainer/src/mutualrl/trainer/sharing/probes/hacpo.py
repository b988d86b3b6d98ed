"""Probes `hacpo` and `hacpo-naive`: every peer response to a prompt joins the learner's group
(docs/design.md (12)); the learner keeps each policy's capability from the reward statistics the
policies publish every round, weights peer rewards in its baseline by it, and gives each peer row
the sender's mean token log-prob for the loss's sequence ratio. `hacpo-naive` is the paper's
ablation: the same pooled group with every capability ratio 1."""

from __future__ import annotations

from typing import Any

import torch

from mutualrl.trainer.algos.hacpo import Capability
from mutualrl.trainer.sharing.exchange import PeerExchange, PeerRollout
from mutualrl.trainer.sharing.probes.base import LossInputs, RoundData
from mutualrl.trainer.sharing.probes.prp import RolloutProbe, flatten


class HACPOProbe(RolloutProbe):
    kind = "hacpo"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.capability = Capability(self.settings.hacpo_window)
        """Every policy's mean reward of its last rounds (own from its rewards, peers' from
        their REWARD_STATS)."""

    def wait(self, data: RoundData, ex: PeerExchange, deadline: float) -> bool:
        """The bounded wait for the round, which also reads every peer's reward statistics of
        it: the round's entry of their capability."""
        per_policy, complete = ex.policy_stats(data.round, [p.id for p in data.prompts],
                                               deadline, data.peers_now)
        self.capability.record(self.policy, data.round, float(data.rewards.mean()))
        for policy, stats in per_policy.items():
            if stats.count:
                self.capability.record(policy, data.round, stats.mean)
        return complete

    def ratio(self, source: str, target: str) -> float:
        """clip(P_source / P_target) (1 for `hacpo-naive`)."""
        s = self.settings
        if self.kind == "hacpo-naive":
            return 1.0
        return self.capability.ratio(source, target, s.hacpo_ratio_min, s.hacpo_ratio_max)

    def build(self, data: RoundData, ex: PeerExchange,
              per_prompt: dict[int, list[PeerRollout]], stats: dict[str, float]) -> LossInputs:
        stats.update({f"hacpo_P/{p}": self.capability.of(p)
                      for p in sorted(self.capability.rounds)})
        baseline = {i: [self.ratio(self.policy, r.policy) for r in rs]
                    for i, rs in per_prompt.items()}
        own_adv, peer_adv = self.advantages(data, per_prompt, baseline=baseline)
        if not per_prompt:
            return LossInputs(advantages=own_adv, stats=stats)
        chosen, _ = flatten(per_prompt)
        weights = torch.tensor([self.ratio(r.policy, self.policy) for r in chosen],
                               dtype=torch.float64)
        peers = self.peer_rows(ex, per_prompt, peer_adv, stats, chunk=False, data=data,
                               capability=weights)
        return LossInputs(advantages=own_adv, peers=peers, stats=stats)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "capability": self.capability.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.capability.load_state_dict(state.get("capability") or {})


class HACPONaiveProbe(HACPOProbe):
    kind = "hacpo-naive"
