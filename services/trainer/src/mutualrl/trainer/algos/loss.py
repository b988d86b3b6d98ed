"""The round's loss, in the order the objective reads (docs/algorithms.md; docs/design.md
(1)-(5), (8)):

1. **advantages** of each row: group-relative rewards, divided by the scale `SCALES` names
   (the group's std, the round's, or none);
2. **per-row weights**: the factor c_i every row's token sum carries (`row_coefficients`: the
   aggregation's denominator, SGT's -lambda per prompt and demonstration), and PRP's importance
   weights of peer rows (`algos.prp.peer_weights`);
3. **token losses**: the clipped policy gradient with the ratio `RATIOS` names (per token:
   GRPO, DAPO; per sequence: GSPO), the k3 KL to the reference, the entropy bonus;
4. **aggregation**: sum_i c_i sum_t l_it m_it, which for the modes of `AGGREGATORS` is the
   reduction `aggregate` takes in one call.

`grpo_loss` is 3-4 in one call over a padded batch; `runtime.step` takes the same sum over
micro-batches. The knobs come as one settings object (`TokenLossSettings`, `LossSettings`:
`config.GRPOSettings` has them), as `algos.prp.WeightSettings` does. Tensors are padded:
``[B, T]`` per-token values with a ``mask`` (1 = real completion token that enters the loss);
a batch of ``P`` prompts x ``G`` samples has rows ``B = P * G`` (prompt-major). Only torch is
imported here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from mutualrl.trainer.algos.modes import Aggregation, RatioLevel, ScaleRewards, aggregation_mode

EPS = 1e-6
"""Added to the reward std so an all-equal group gives advantage 0 instead of 0/0."""


# 1. Advantages ------------------------------------------------------------------------------

def _group_std(rewards: Tensor, batch: Tensor | None) -> Tensor | None:
    return rewards.std(dim=-1, correction=0, keepdim=True)


def _batch_std(rewards: Tensor, batch: Tensor | None) -> Tensor | None:
    return (rewards if batch is None else batch).std(correction=0)


def _no_scale(rewards: Tensor, batch: Tensor | None) -> Tensor | None:
    return None


SCALES: dict[ScaleRewards, Callable[[Tensor, Tensor | None], Tensor | None]] = {
    "group": _group_std, "batch": _batch_std, "none": _no_scale}
"""`grpo.scale_rewards` -> the std a group's centred rewards are divided by (None: not
divided), given the group's rewards and the round's."""


def group_advantages(rewards: Tensor, eps: float = EPS, scale: ScaleRewards = "group",
                     batch: Tensor | None = None) -> Tensor:
    """A_k = (r_k - mean(r)) / (s + eps) over the last dim (docs/design.md (1)), s the std
    (ddof=0) that `scale` names: the group's, the round's rewards' (`batch`, default
    `rewards` itself) or none (A_k = r_k - mean(r), no eps).

    ddof=0 (population std): a group of G samples is the whole population the baseline
    describes, not a sample of a larger one.
    """
    mean = rewards.mean(dim=-1, keepdim=True)
    std = SCALES[scale](rewards, batch)
    if std is None:
        return rewards - mean
    return (rewards - mean) / (std + eps)


def nonzero_variance_groups(rewards: Tensor) -> Tensor:
    """Bool ``[P, G]``: True for samples of groups whose rewards are not all equal
    (docs/design.md (5)).

    An all-equal group has zero advantage everywhere; dropping it keeps it out of the
    token-mean denominator (DAPO's dynamic sampling without the resampling).
    """
    keep = (rewards != rewards[..., :1]).any(dim=-1, keepdim=True)
    return keep.expand_as(rewards)


# 2. Per-row weights -------------------------------------------------------------------------

def _token_mean(lengths: Tensor, live: float, max_len: int) -> Tensor:
    return torch.full_like(lengths, 1.0 / float(lengths.sum().clamp(min=1.0)))


def _sequence_mean(lengths: Tensor, live: float, max_len: int) -> Tensor:
    return 1.0 / (lengths.clamp(min=1.0) * live)


def _constant_length(lengths: Tensor, live: float, max_len: int) -> Tensor:
    return torch.full_like(lengths, 1.0 / (live * max_len))


AGGREGATORS: dict[Aggregation, Callable[[Tensor, float, int], Tensor]] = {
    "token_mean": _token_mean, "sequence_mean": _sequence_mean,
    "constant_length": _constant_length}
"""Aggregation mode -> the per-row factor c_i of its policy-gradient rows, given their real
token counts, the number of rows with any real token and max_len (docs/design.md (4))."""


def row_coefficients(mask: Tensor, demo: Tensor, group: Tensor, aggregation: str, max_len: int,
                     sgt_lambda: float) -> Tensor:
    """``[N]`` per-row factor c_i so that sum_i c_i sum_t v_it m_it is the loss of these rows:
    the aggregation over the policy-gradient rows (``~demo``) and SGT's -lambda mean over
    prompts of mean over demonstrations of the mean token log-prob (docs/design.md (7)),
    demonstrations grouped by their prompt label ``group``. The factors depend on every row,
    so they are fixed before any micro-batch is scored."""
    lengths = mask.sum(-1)
    pg = ~demo
    live = float((pg & (lengths > 0)).sum().clamp(min=1))
    c = torch.zeros(mask.shape[0], dtype=torch.float64)
    c[pg] = AGGREGATORS[aggregation_mode(aggregation)](lengths[pg], live, max_len).to(c)
    if bool(demo.any()):
        _, g = torch.unique(group[demo], return_inverse=True)
        per_prompt = torch.bincount(g).to(torch.float64)
        c[demo] = -sgt_lambda / (len(per_prompt) * per_prompt[g]
                                 * lengths[demo].clamp(min=1.0))
    return c


# 3. Token losses ----------------------------------------------------------------------------

def _token_log_ratio(log_rho: Tensor, mask: Tensor | None) -> Tensor:
    return log_rho


def _sequence_log_ratio(log_rho: Tensor, mask: Tensor | None) -> Tensor:
    m = torch.ones_like(log_rho) if mask is None else mask.to(log_rho.dtype)
    return (log_rho * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)


RATIOS: dict[RatioLevel, Callable[[Tensor, Tensor | None], Tensor]] = {
    "token": _token_log_ratio, "sequence": _sequence_log_ratio}
"""`grpo.importance_sampling_level` -> log rho from the per-token log ratios and the mask:
per token (GRPO, DAPO), or one per sequence, the mean over its real tokens (GSPO), ``[B, 1]``."""


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 estimator of KL(pi_theta || pi_ref) per token: exp(d) - d - 1 with d = ref - theta
    (docs/design.md (3)).

    Non-negative and unbiased for samples drawn from pi_theta (Schulman's k3).
    """
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


@dataclass
class TokenLoss:
    """Per-token loss parts, before aggregation (all ``[B, T]``)."""

    total: Tensor
    """pg + beta * kl, the value that is aggregated into the loss."""
    pg: Tensor
    """-min(rho A, clip(rho) A), times the sample weight where one is given."""
    kl: Tensor
    """k3 KL per token (zeros when no reference log-probs are given)."""
    clipped_low: Tensor
    """Bool: rho < 1 - eps_lo with A < 0 (the clipped branch is the one taken)."""
    clipped_high: Tensor
    """Bool: rho > 1 + eps_hi with A > 0."""


class TokenLossSettings(Protocol):
    """The token loss's knobs (`config.GRPOSettings` has them)."""

    eps_lo: float
    """rho is clipped at 1 - eps_lo (negative advantages)."""
    eps_hi: float
    """rho is clipped at 1 + eps_hi (positive advantages)."""
    beta: float
    """Weight of the k3 KL to the reference."""
    importance_sampling_level: RatioLevel
    """The ratio per token or per sequence (`RATIOS`)."""
    max_log_ratio: float | None
    """log rho is clamped to +-this before exp (None: not clamped)."""


def token_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    s: TokenLossSettings,
    ref_logp: Tensor | None = None,
    weights: Tensor | None = None,
    mask: Tensor | None = None,
) -> TokenLoss:
    """GRPO loss per token: -min(rho A, clip(rho, 1-eps_lo, 1+eps_hi) A) + beta * KL_t, with
    log rho the ratio of logp - logp_old that `s.importance_sampling_level` names
    (docs/design.md (2), (3); GSPO: the mean over the row's ``mask``ed tokens, every token of a
    row then carries the same value), clamped to +-`s.max_log_ratio` when set; the knobs are
    `s`'s.

    ``advantages`` is ``[B]`` (one per sequence) or ``[B, T]``. ``weights`` (``[B]`` or
    ``[B, T]``, treated as constants) multiply the policy-gradient part: PRP's importance
    weights for peer samples; KL is not weighted because it regularises the receiver itself.
    """
    eps_lo, eps_hi, beta = s.eps_lo, s.eps_hi, s.beta
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    log_rho = RATIOS[s.importance_sampling_level](logp - logp_old, mask)
    if s.max_log_ratio is not None:
        log_rho = log_rho.clamp(-s.max_log_ratio, s.max_log_ratio)
    rho = torch.exp(log_rho)
    clipped = torch.clamp(rho, 1.0 - eps_lo, 1.0 + eps_hi)
    pg = (-torch.min(rho * adv, clipped * adv)).expand_as(logp)
    if weights is not None:
        w = weights.unsqueeze(-1) if weights.dim() == 1 else weights
        pg = pg * w.detach()
    if ref_logp is not None and beta != 0.0:
        kl = k3_kl(logp, ref_logp)
        total = pg + beta * kl
    else:
        kl = torch.zeros_like(pg)
        total = pg
    return TokenLoss(
        total=total,
        pg=pg,
        kl=kl,
        clipped_low=((rho < 1.0 - eps_lo) & (adv < 0)).expand_as(logp),
        clipped_high=((rho > 1.0 + eps_hi) & (adv > 0)).expand_as(logp),
    )


def entropy_bonus(entropy: Tensor, mask: Tensor, coef: float) -> Tensor:
    """-coef times the mean entropy over the real tokens of ``mask`` (TRL's entropy bonus: a
    token mean whatever the aggregation of the policy-gradient term)."""
    m = mask.to(entropy.dtype)
    return -coef * (entropy * m).sum() / m.sum().clamp(min=1.0)


# 4. Aggregation -----------------------------------------------------------------------------

def aggregate(
    values: Tensor, mask: Tensor, mode: str, max_len: int | None = None
) -> Tensor:
    """Reduce ``[B, T]`` per-token values to a scalar (docs/design.md (4)).

    - ``token_mean`` (DAPO): sum over all real tokens / number of real tokens (long answers
      weigh more).
    - ``sequence_mean`` (GRPO): mean over each sequence's tokens, then mean over sequences.
    - ``constant_length`` (Dr. GRPO): sum / (num_seqs * max_len) with a constant max_len (no
      length bias).
    `mode` may also be a paper's name for the mode. Sequences with no real token (masked
    out, e.g. filtered groups) do not count.
    """
    mode = aggregation_mode(mode)
    m = mask.to(values.dtype)
    if mode == "token_mean":
        return (values * m).sum() / m.sum().clamp(min=1.0)
    lengths = m.sum(dim=-1)
    live = lengths > 0
    num_seqs = live.sum().clamp(min=1).to(values.dtype)
    if mode == "sequence_mean":
        per_seq = (values * m).sum(dim=-1) / lengths.clamp(min=1.0)
        return per_seq[live].sum() / num_seqs
    length = values.shape[-1] if max_len is None else max_len  # constant_length
    return (values * m).sum() / (num_seqs * length)


@dataclass
class GRPOLoss:
    """The scalar loss and the statistics a round reports."""

    loss: Tensor
    """Aggregated pg + beta * KL, plus the entropy bonus; the tensor to backpropagate."""
    pg_loss: float
    kl: float
    """Token-mean KL over real tokens (whatever the aggregation mode)."""
    clip_frac: float
    """Share of real tokens where either clip branch is active."""
    clip_frac_low: float
    clip_frac_high: float
    entropy: float = 0.0
    """Token-mean entropy over real tokens (0 when none is given)."""


class LossSettings(TokenLossSettings, Protocol):
    """The whole loss's knobs: the token loss's, the reduction and the entropy bonus
    (`config.GRPOSettings` has them)."""

    aggregation: Aggregation
    """How the per-token losses reduce (`AGGREGATORS`)."""
    entropy_coef: float
    """Weight of the entropy bonus (0: none)."""


def grpo_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    s: LossSettings,
    ref_logp: Tensor | None = None,
    weights: Tensor | None = None,
    entropy: Tensor | None = None,
    max_len: int | None = None,
) -> GRPOLoss:
    """token_loss + aggregate (+ the entropy bonus of ``entropy``, ``[B, T]``, when
    ``s.entropy_coef`` is not 0), with statistics (docs/design.md (2)-(4)). ``mask`` may
    already exclude filtered groups; ``max_len`` is `constant_length`'s constant."""
    aggregation = s.aggregation
    parts = token_loss(logp, logp_old, advantages, s, ref_logp, weights, mask)
    loss = aggregate(parts.total, mask, aggregation, max_len)
    if entropy is not None and s.entropy_coef != 0.0:
        loss = loss + entropy_bonus(entropy, mask, s.entropy_coef)
    with torch.no_grad():
        m = mask.to(logp.dtype)
        n = m.sum().clamp(min=1.0)
        low = (parts.clipped_low.to(m.dtype) * m).sum() / n
        high = (parts.clipped_high.to(m.dtype) * m).sum() / n
        pg = aggregate(parts.pg, mask, aggregation, max_len)
        kl = (parts.kl * m).sum() / n
        ent = (entropy * m).sum() / n if entropy is not None else torch.zeros(())
    return GRPOLoss(
        loss=loss,
        pg_loss=float(pg),
        kl=float(kl),
        clip_frac=float(low + high),
        clip_frac_low=float(low),
        clip_frac_high=float(high),
        entropy=float(ent),
    )
