"""Probe `xgrpo`: pool the reward baseline and scale over all policies' groups of a prompt."""

from __future__ import annotations

from mutualrl.trainer.algos.xgrpo import baseline_shift, xgrpo_advantages
from mutualrl.trainer.sharing.exchange import PeerExchange
from mutualrl.trainer.sharing.probes.base import LossInputs, Probe, RoundData


class XGRPOProbe(Probe):
    kind = "xgrpo"
    same_round = True

    def gather(self, data: RoundData, ex: PeerExchange, deadline: float) -> LossInputs:
        # Peers answer the same prompts in the same round: wait (bounded) for their stats.
        pooled, _, complete = ex.peer_stats(data.round, [p.id for p in data.prompts], deadline,
                                            data.peers_now)
        peer = [pooled.get(p.id) for p in data.prompts]
        used = sum(s is not None for s in peer)
        return LossInputs(
            advantages=xgrpo_advantages(data.rewards, peer, scale=self.scale),
            stats={
                "peer_prompts": float(used),
                "baseline_shift": baseline_shift(data.rewards, peer),
                "peers_complete": float(complete),
                # The deadline passed with nothing from any peer: this round was plain GRPO.
                "fallback": float(not complete and used == 0),
            },
        )
