"""Probe `ftis`: each peer's group of a prompt is a group of its own; its tokens carry truncated
importance weights and its negative samples pass a KL gate, per THL chunk across tokenizers
(docs/design.md (14)). The generator's per-token log-probs are the ones PRP reads."""

from __future__ import annotations

import torch

from mutualrl.trainer.sharing.exchange import PeerExchange, PeerRollout
from mutualrl.trainer.sharing.probes.base import LossInputs, PeerRows, RoundData
from mutualrl.trainer.sharing.probes.prp import RolloutProbe, flatten
from mutualrl.trainer.sharing.probes.sapo import WHOLE


class FTISProbe(RolloutProbe):
    kind = "ftis"

    def cap(self) -> int:
        return WHOLE

    def build(self, data: RoundData, ex: PeerExchange,
              per_prompt: dict[int, list[PeerRollout]], stats: dict[str, float]) -> LossInputs:
        own_adv, peer_adv = self.advantages(data, per_prompt)
        chosen, prompt_index = flatten(per_prompt)
        if not chosen:
            return LossInputs(advantages=own_adv, stats=stats)
        aligned = ex.align(chosen, chunk_level=True)  # one tokenizer: the chunks are tokens
        stats["thl_multi_token_chunk_share"] = sum(
            a.multi_token_chunk_share for a in aligned) / len(aligned)
        peers = PeerRows(
            prompt_index=prompt_index,
            token_ids=[a.token_ids for a in aligned],
            advantages=torch.cat([peer_adv[i] for i in sorted(per_prompt)]),
            sender_logp_sum=torch.tensor([a.sender_logp_sum for a in aligned],
                                         dtype=torch.float64),
            token_chunk=[a.token_chunk for a in aligned],
            chunk_sender_logp=[a.chunk_sender_logp for a in aligned],
            method=self.kind,
        )
        return LossInputs(advantages=own_adv, peers=peers, stats=stats)
