"""The correction of rows sampled by older weights (docs/algorithms.md, "Off-policy
correction"; docs/design.md (2)).

With a rollout worker a round's own rows may come from weights d versions behind the ones the
update starts from. The clipped ratio of the loss is taken against those current weights (the
proximal policy of decoupled PPO), and each row's policy-gradient term carries an importance
weight between the current weights and the behaviour ones that sampled it, from the behaviour
log-probs the engine returned (`Sample.logprobs`). With r = pi_current / pi_behaviour per token
(`token`) or per completion (`sequence`: the product over its tokens):

- `tis`, truncated importance sampling: w = min(r, C) (IMPALA's rho-bar truncation, Espeholt
  et al. 2018; the TIS of Yao et al. 2025, "Your efficient RL framework secretly brings you
  off-policy RL training");
- `mis`, masked importance sampling: w = r where 1/C <= r <= C, and the token (or the whole
  row) leaves the loss beyond the band (IcePop, Ling Team 2025);
- `none`: w = 1.

The functions share one signature and are registered in `CORRECTIONS`; their knobs come as
`CorrectionSettings` (`config.GRPOSettings` has them). Only torch is imported here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from mutualrl.trainer.algos.modes import OffPolicyCorrection, RatioLevel


class CorrectionSettings(Protocol):
    """The correction's knobs (`config.GRPOSettings` has them)."""

    off_policy_correction: OffPolicyCorrection
    """Which of `CORRECTIONS`."""
    off_policy_level: RatioLevel
    """r per token, or per sequence (the product of the row's token ratios)."""
    off_policy_cap: float
    """C: the cap of `tis`, the band [1/C, C] of `mis`."""


@dataclass
class BehaviourWeights:
    """What the correction does to a batch of rows (all ``[B, T]``)."""

    weights: Tensor
    """w, multiplying each token's policy-gradient term (1 where nothing is corrected)."""
    keep: Tensor
    """1 where the token stays in the loss, 0 where `mis` masked it."""
    stats: dict[str, float]
    """`offpolicy/ratio_mean` (mean r over real tokens), `offpolicy/truncated` (share of
    real tokens whose weight the cap changed), `offpolicy/masked` (share masked)."""


def log_ratio(logp: Tensor, behaviour: Tensor, mask: Tensor, level: RatioLevel) -> Tensor:
    """log r: logp - behaviour per token, or per row the sum over its real tokens (``[B, 1]``,
    broadcast over T), 0 on padding."""
    m = mask.to(logp.dtype)
    per_token = (logp - behaviour) * m
    if level == "sequence":
        return per_token.sum(-1, keepdim=True).expand_as(logp)
    return per_token


def _stats(lr: Tensor, w: Tensor, keep: Tensor, mask: Tensor, changed: Tensor
           ) -> dict[str, float]:
    m = mask.to(lr.dtype)
    n = float(m.sum().clamp(min=1.0))
    return {"offpolicy/ratio_mean": float((lr.clamp(max=80.0).exp() * m).sum()) / n,
            "offpolicy/truncated": float((changed.to(m) * m).sum()) / n,
            "offpolicy/masked": float(((1 - keep.to(m)) * m).sum()) / n}


def truncated_is(logp: Tensor, behaviour: Tensor, mask: Tensor, s: CorrectionSettings
                 ) -> BehaviourWeights:
    """w = min(r, C); every token stays (exp taken of min(log r, log C): no overflow)."""
    lr = log_ratio(logp, behaviour, mask, s.off_policy_level)
    cap = math.log(s.off_policy_cap)
    w = torch.exp(lr.clamp(max=cap))
    keep = torch.ones_like(w)
    return BehaviourWeights(w, keep, _stats(lr, w, keep, mask, lr > cap))


def masked_is(logp: Tensor, behaviour: Tensor, mask: Tensor, s: CorrectionSettings
              ) -> BehaviourWeights:
    """w = r inside [1/C, C]; tokens (rows, per sequence) outside leave the loss."""
    lr = log_ratio(logp, behaviour, mask, s.off_policy_level)
    cap = math.log(s.off_policy_cap)
    inside = lr.abs() <= cap
    keep = inside.to(logp.dtype)
    w = torch.exp(lr.clamp(-cap, cap)) * keep
    return BehaviourWeights(w, keep, _stats(lr, w, keep, mask, torch.zeros_like(inside)))


def no_correction(logp: Tensor, behaviour: Tensor, mask: Tensor, s: CorrectionSettings
                  ) -> BehaviourWeights:
    """w = 1 (the lag is left uncorrected; the ratio's clip alone bounds the step)."""
    lr = log_ratio(logp, behaviour, mask, s.off_policy_level)
    one = torch.ones_like(logp)
    return BehaviourWeights(one, one, _stats(lr, one, one, mask, torch.zeros_like(lr)))


CORRECTIONS: dict[OffPolicyCorrection, Callable[[Tensor, Tensor, Tensor, CorrectionSettings],
                                       BehaviourWeights]] = {
    "tis": truncated_is, "mis": masked_is, "none": no_correction}
"""`grpo.off_policy_correction` -> its function: (current log-probs, behaviour log-probs,
mask, settings) -> the rows' weights and what stays in the loss."""


def behaviour_weights(logp: Tensor, behaviour: Tensor, mask: Tensor, s: CorrectionSettings
                      ) -> BehaviourWeights:
    """The correction `s.off_policy_correction` names, for rows of ``[B, T]`` current
    (`logp`, no gradient) and behaviour log-probs."""
    return CORRECTIONS[s.off_policy_correction](logp.detach(), behaviour, mask, s)
