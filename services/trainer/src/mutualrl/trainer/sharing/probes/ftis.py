"""Probe `ftis`: each peer's group of a prompt is a group of its own; its tokens carry truncated
importance weights and its negative samples pass a KL gate, per THL chunk across tokenizers
(docs/design.md (14)). The generator's per-token log-probs are the ones PRP reads."""

from __future__ import annotations

from mutualrl.trainer.sharing.exchange import PeerExchange, PeerRollout
from mutualrl.trainer.sharing.probes.base import LossInputs, RoundData
from mutualrl.trainer.sharing.probes.prp import RolloutProbe
from mutualrl.trainer.sharing.probes.sapo import WHOLE


class FTISProbe(RolloutProbe):
    kind = "ftis"

    def cap(self) -> int:
        return WHOLE

    def build(self, data: RoundData, ex: PeerExchange,
              per_prompt: dict[int, list[PeerRollout]], stats: dict[str, float]) -> LossInputs:
        own_adv, peer_adv = self.advantages(data, per_prompt)
        if not per_prompt:
            return LossInputs(advantages=own_adv, stats=stats)
        # Per THL chunk; with one tokenizer the chunks are single tokens.
        peers = self.peer_rows(ex, per_prompt, peer_adv, stats, chunk=True, data=data)
        return LossInputs(advantages=own_adv, peers=peers, stats=stats)
