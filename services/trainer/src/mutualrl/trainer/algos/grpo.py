"""GRPO: group advantages, the clipped per-token loss, k3 KL and the aggregation modes
(docs/design.md, equations (1)-(5)).

Tensors are padded: ``[B, T]`` per-token values with a ``mask`` (1 = real completion token).
A batch holds ``P`` prompts x ``G`` samples as rows ``B = P * G`` (prompt-major).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mutualrl.trainer.algos.aggregation import aggregation_mode

EPS = 1e-6
"""Added to the group std so an all-equal group gives advantage 0 instead of 0/0."""

def group_advantages(rewards: Tensor, eps: float = EPS) -> Tensor:
    """A_k = (r_k - mean(r)) / (std(r) + eps) over the last dim, std with ddof=0
    (docs/design.md (1)).

    ddof=0 (population std): a group of G samples is the whole population the baseline
    describes, not a sample of a larger one.
    """
    mean = rewards.mean(dim=-1, keepdim=True)
    std = rewards.std(dim=-1, correction=0, keepdim=True)
    return (rewards - mean) / (std + eps)


def nonzero_variance_groups(rewards: Tensor) -> Tensor:
    """Bool ``[P, G]``: True for samples of groups whose rewards are not all equal
    (docs/design.md (5)).

    An all-equal group has zero advantage everywhere; dropping it keeps it out of the
    token-mean denominator (DAPO's dynamic sampling without the resampling).
    """
    keep = (rewards != rewards[..., :1]).any(dim=-1, keepdim=True)
    return keep.expand_as(rewards)


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


def token_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    eps_lo: float = 0.2,
    eps_hi: float = 0.28,
    beta: float = 0.0,
    ref_logp: Tensor | None = None,
    weights: Tensor | None = None,
) -> TokenLoss:
    """GRPO loss per token: -min(rho A, clip(rho, 1-eps_lo, 1+eps_hi) A) + beta * KL_t, with
    rho = exp(logp - logp_old) (docs/design.md (2), (3)).

    ``advantages`` is ``[B]`` (one per sequence) or ``[B, T]``. ``weights`` (``[B]`` or
    ``[B, T]``, treated as constants) multiply the policy-gradient part: PRP's importance
    weights for peer samples; KL is not weighted because it regularises the receiver itself.
    """
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    rho = torch.exp(logp - logp_old)
    clipped = torch.clamp(rho, 1.0 - eps_lo, 1.0 + eps_hi)
    pg = -torch.min(rho * adv, clipped * adv)
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
        clipped_low=(rho < 1.0 - eps_lo) & (adv < 0),
        clipped_high=(rho > 1.0 + eps_hi) & (adv > 0),
    )


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
    """Aggregated pg + beta * KL; the tensor to backpropagate."""
    pg_loss: float
    kl: float
    """Token-mean KL over real tokens (whatever the aggregation mode)."""
    clip_frac: float
    """Share of real tokens where either clip branch is active."""
    clip_frac_low: float
    clip_frac_high: float


def grpo_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_lo: float = 0.2,
    eps_hi: float = 0.28,
    beta: float = 0.0,
    ref_logp: Tensor | None = None,
    aggregation: str = "token_mean",
    max_len: int | None = None,
    weights: Tensor | None = None,
) -> GRPOLoss:
    """token_loss + aggregate, with statistics (docs/design.md (2)-(4)). ``mask`` may already
    exclude filtered groups."""
    parts = token_loss(logp, logp_old, advantages, eps_lo, eps_hi, beta, ref_logp, weights)
    loss = aggregate(parts.total, mask, aggregation, max_len)
    with torch.no_grad():
        m = mask.to(logp.dtype)
        n = m.sum().clamp(min=1.0)
        low = (parts.clipped_low.to(m.dtype) * m).sum() / n
        high = (parts.clipped_high.to(m.dtype) * m).sum() / n
        pg = aggregate(parts.pg, mask, aggregation, max_len)
        kl = (parts.kl * m).sum() / n
    return GRPOLoss(
        loss=loss,
        pg_loss=float(pg),
        kl=float(kl),
        clip_frac=float(low + high),
        clip_frac_low=float(low),
        clip_frac_high=float(high),
    )
