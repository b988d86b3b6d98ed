"""The probes that train on peers' rollouts, as registered function sets (docs/design.md (9),
(12)-(14)): how a method forms the advantages of own and peer rows, the row weights (and
anything else) it fixes before the round's first update, and the token loss of its peer rows.

- `prp`: advantages pooled over own + peer rewards; row weights w = π_i / π_j per sequence or
  THL chunk (drop / truncate / none); peer rows take GRPO's token loss times w.
- `hacpo`, `hacpo-naive`: pooled advantages with a capability-weighted baseline; row weights
  clip(P_j / P_k) (1 for the naive ablation); peer rows' token loss
  −clip(s, l_m, 1) · sg(clip(s, l_m, 1))^α · w · A.
- `sapo`: advantages within each (peer, prompt) group; weights 1; GRPO's token loss.
- `ftis`: advantages within each (peer, prompt) group; weights min(π_θ / π_gen, C) per chunk and
  a KL gate on negative samples; GRPO's token loss times w.

Own rows always take the run's GRPO token loss. The probes (`sharing.probes`) call `advantages`
on a round's rewards; the step (`runtime.step`) calls `weights` with the learner's pre-step
log-probs of the peer rows and, when a method has one, `token_loss` on its peer rows. Only torch
and the standard library are imported here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from mutualrl.trainer.algos import ftis, hacpo, sapo
from mutualrl.trainer.algos.hacpo import HacpoSettings, PeerGroup
from mutualrl.trainer.algos.loss import EPS, TokenLoss
from mutualrl.trainer.algos.modes import ScaleRewards
from mutualrl.trainer.algos.prp import WeightSettings, peer_weights, pooled_advantages
from mutualrl.trainer.algos.sapo import SapoSettings


class PeerSettings(WeightSettings, HacpoSettings, SapoSettings, ftis.FtisSettings, Protocol):
    """Every peer method's knobs (`config.ProbeSettings` has them)."""


@dataclass
class PeerPrep:
    """What a method fixes of its peer rows before the round's first update."""

    weights: Tensor
    """[M, T] the factor the peer rows' policy-gradient term carries (constants of the step)."""
    keep: Tensor
    """[M, T] the peer rows' mask (dropped or filtered rows: 0)."""
    stats: dict[str, float] = field(default_factory=dict)
    behaviour: Tensor | None = None
    """[M, T] what the method's token loss takes as the sender's log-probs (HACPO: the
    sender's mean token log-prob on every token of its row)."""


AdvantageFn = Callable[[Tensor, Sequence[PeerGroup], ScaleRewards, Any],
                       tuple[Tensor, list[Tensor]]]
"""(own rewards [P, G], each prompt's peer rows, scale, settings) -> (own advantages [P, G],
each prompt's peer advantages)."""
WeightFn = Callable[[Tensor, Tensor, Any, Any], PeerPrep]
"""(pre-step log-probs [M, T], mask [M, T], the peer rows, settings) -> PeerPrep."""
PeerLossFn = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Any, int], TokenLoss]
"""(log-probs [B, T], behaviour [B, T], advantages [B], weights [B, T], mask [B, T],
settings, the round's update index) -> the peer rows' per-token loss."""


@dataclass(frozen=True)
class PeerMethod:
    """One method's function set."""

    advantages: AdvantageFn
    weights: WeightFn
    token_loss: PeerLossFn | None = None
    """None: GRPO's token loss (the run's `grpo` settings) times the weights."""


def splice(base: TokenLoss, theirs: TokenLoss, rows: Tensor) -> TokenLoss:
    """`base`'s per-token values with those of the rows `rows` (``[B]`` bool) taken from
    `theirs`: own rows keep GRPO's loss, a method's peer rows take its own."""
    sel = rows.unsqueeze(-1)

    def pick(a: Tensor, b: Tensor) -> Tensor:
        return torch.where(sel, b, a)

    return TokenLoss(total=pick(base.total, theirs.total), pg=pick(base.pg, theirs.pg),
                     kl=pick(base.kl, theirs.kl),
                     clipped_low=pick(base.clipped_low, theirs.clipped_low),
                     clipped_high=pick(base.clipped_high, theirs.clipped_high))


def _pooled(own: Tensor, peers: Sequence[PeerGroup], scale: ScaleRewards, s: Any
            ) -> tuple[Tensor, list[Tensor]]:
    return pooled_advantages(own, [p.rewards for p in peers], EPS, scale)


def _prp_weights(logp_old: Tensor, mask: Tensor, rows: Any, s: Any) -> PeerPrep:
    w, keep, stats = peer_weights(logp_old, mask, rows, s)
    return PeerPrep(weights=w, keep=keep, stats={f"prp_w_{k}": v for k, v in stats.items()})


def _hacpo_advantages(own: Tensor, peers: Sequence[PeerGroup], scale: ScaleRewards, s: Any
                      ) -> tuple[Tensor, list[Tensor]]:
    return hacpo.hacpo_advantages(own, peers, scale, s)


def _hacpo_weights(logp_old: Tensor, mask: Tensor, rows: Any, s: Any) -> PeerPrep:
    cross = hacpo.cross_rows(logp_old, mask, rows, s)
    return PeerPrep(weights=cross.weights, keep=mask.clone(), stats=cross.stats,
                    behaviour=cross.behaviour)


def _unweighted(logp_old: Tensor, mask: Tensor, rows: Any, s: Any) -> PeerPrep:
    return PeerPrep(weights=logp_old.new_ones(logp_old.shape), keep=mask.clone())


def _ftis_weights(logp_old: Tensor, mask: Tensor, rows: Any, s: Any) -> PeerPrep:
    out = ftis.ftis_rows(logp_old, mask, rows, s)
    return PeerPrep(weights=out.weights, keep=out.keep, stats=out.stats)


def _per_source(own: Tensor, peers: Sequence[PeerGroup], scale: ScaleRewards, s: Any
                ) -> tuple[Tensor, list[Tensor]]:
    return sapo.per_source_advantages(own, peers, scale)


_HACPO = PeerMethod(_hacpo_advantages, _hacpo_weights, hacpo.cross_token_loss)

METHODS: dict[str, PeerMethod] = {
    "prp": PeerMethod(_pooled, _prp_weights),
    "hacpo": _HACPO,
    "hacpo-naive": _HACPO,  # the probe gives every capability ratio as 1
    "sapo": PeerMethod(_per_source, _unweighted),
    "ftis": PeerMethod(_per_source, _ftis_weights),
}
"""Probe kind -> its function set."""
