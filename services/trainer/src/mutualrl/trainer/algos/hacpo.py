"""HACPO: heterogeneous agent collaborative policy optimisation (Zhang et al., arXiv 2603.02604;
docs/design.md (12)).

Every response of every policy to a prompt joins the learner's group, with no correctness filter.
What crosses is the completion text and the sender's mean token log-prob (SEE's ROLLOUT records
carry the sender's per-token behaviour log-probs; their mean is taken here) and each policy's
reward statistics per round (REWARD_STATS), from which the learner keeps every policy's
*capability* P (its mean reward over its last `hacpo_window` rounds). For learner k and a
response of policy j:

- advantage (r − μ_k) / (σ + ε): μ_k the pooled mean with j's rewards weighted by
  clip(P_k / P_j, lo, hi) (own ones by 1), σ the plain pooled std (or the run's
  `scale_rewards`); a group whose rewards are all equal keeps the plain mean (the weights must
  not create a signal), and a weighted mean above `hacpo_baseline_cap` falls back to the
  learner's own mean (the authors' guard for 0/1 rewards);
- own rows: the run's GRPO token loss; the paper's configuration (the experiment's `hacpo`
  arm) sets it to GSPO's sequence ratio with GSPO's clip radii and a row mean, splits the
  round into four mini-batches, clamps every row's log ratio to ±10, and reads the peers of the
  same round, so the joint baseline above reaches own rows (with a lag own rows take GRPO's
  advantages: `probes.base.delayed`);
- peer rows: s = exp(mean_t log π_k(y_t) − mean_u log π_j,old(y_u)), the first mean over the
  learner's tokens and the second over the sender's (`hacpo_ratio_length: learner` takes the
  learner's count for both, an ablation), clamped to ±`hacpo_max_log_ratio` in log space; the
  objective is
  clip(s, l_m, 1) · sg(clip(s, l_m, 1))^α · clip(P_j / P_k, lo, hi) · A with the lower bound
  l_m = min(1, 1 − δ + m · δ_step) tightening with the round's update index m (stepwise
  clipping); no KL term on peer rows (the authors' recipe applies the KL to own rows only).

`hacpo-naive` (the paper's ablation, the plain pooled group) fixes every capability ratio at 1.
The constants' defaults are the authors' recipe (recipe/hacpo in their repository, branch
verl-v1). Only torch and the standard library are imported here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

from mutualrl.trainer.algos.loss import EPS, SCALES, TokenLoss, group_advantages
from mutualrl.trainer.algos.modes import ScaleRewards

P_FLOOR = 1e-8
"""A policy's capability never goes below this (a policy with no reward yet would otherwise
give an infinite ratio; the clip then takes over), as in the authors' tracker."""


class HacpoSettings(Protocol):
    """HACPO's knobs (`config.ProbeSettings` has them)."""

    hacpo_window: int
    hacpo_ratio_min: float
    hacpo_ratio_max: float
    hacpo_alpha: float
    hacpo_delta: float
    hacpo_delta_step: float
    hacpo_max_log_ratio: float
    hacpo_baseline_cap: float | None
    hacpo_ratio_length: Literal["sender", "learner"]


# 1. Capability -----------------------------------------------------------------------------

class Capability:
    """Every policy's mean reward per round, and P = the mean of its last `window` of them."""

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self.window = window
        self.rounds: dict[str, dict[int, float]] = {}
        """policy -> round -> its mean reward that round (the last `window` kept)."""

    def record(self, policy: str, round_k: int, mean_reward: float) -> None:
        """Policy `policy`'s mean reward of round `round_k` (recording a round again replaces
        it)."""
        if not math.isfinite(mean_reward):
            raise ValueError(f"{policy}'s mean reward of round {round_k} is {mean_reward}")
        seen = self.rounds.setdefault(policy, {})
        seen[round_k] = max(float(mean_reward), P_FLOOR)
        for old in sorted(seen)[: -self.window]:
            del seen[old]

    def of(self, policy: str) -> float:
        """P of `policy`: the mean over its recorded rounds (1 before any)."""
        seen = self.rounds.get(policy)
        if not seen:
            return 1.0
        return max(math.fsum(seen.values()) / len(seen), P_FLOOR)

    def ratio(self, source: str, target: str, lo: float, hi: float) -> float:
        """clip(P_source / P_target, lo, hi)."""
        return min(max(self.of(source) / self.of(target), lo), hi)

    def state_dict(self) -> dict[str, Any]:
        return {"window": self.window,
                "rounds": {p: sorted(r.items()) for p, r in self.rounds.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.rounds = {}
        for policy, items in (state.get("rounds") or {}).items():
            for round_k, mean in items:
                self.record(str(policy), int(round_k), float(mean))


# 2. Advantages -----------------------------------------------------------------------------

class PeerGroup(Protocol):
    """The peer rows of one own prompt, as the advantage functions read them."""

    @property
    def rewards(self) -> Tensor:
        """[M] the peers' rewards."""

    @property
    def source(self) -> Sequence[str]:
        """[M] the sending policy of each."""

    @property
    def baseline_weight(self) -> Tensor | None:
        """[M] HACPO: the weight of each reward in the learner's baseline, clip(P_k / P_j)."""


def hacpo_advantages(own: Tensor, peers: Sequence[PeerGroup], scale: ScaleRewards,
                     s: HacpoSettings, eps: float = EPS) -> tuple[Tensor, list[Tensor]]:
    """Own advantages ``[P, G]`` and each prompt's peer advantages over the pooled group with
    capability-weighted baseline (docs/design.md (12)). Prompts without peer rows keep exactly
    GRPO's values (the same batched call). ``scale``: what the centred rewards are divided by,
    the pooled std (`group`, ddof 0), the std of the round's own rewards (`batch`) or nothing
    (`none`)."""
    if len(peers) != own.shape[0]:
        raise ValueError(f"peers has {len(peers)} rows, own rewards {own.shape[0]}")
    own_adv = group_advantages(own, eps, scale)
    peer_adv: list[Tensor] = []
    g = own.shape[1]
    for i, peer in enumerate(peers):
        if peer.rewards.numel() == 0:
            peer_adv.append(peer.rewards.new_zeros(0).to(own.dtype))
            continue
        union = torch.cat([own[i], peer.rewards.to(own.dtype)])
        w = (torch.ones_like(peer.rewards, dtype=own.dtype) if peer.baseline_weight is None
             else peer.baseline_weight.to(own.dtype))
        if bool((union == union[0]).all()):
            baseline = union.mean()  # weights must not make a signal out of equal rewards
        else:
            baseline = (torch.cat([torch.ones(g, dtype=own.dtype), w]) * union).mean()
            if s.hacpo_baseline_cap is not None and float(baseline) > s.hacpo_baseline_cap:
                baseline = own[i].mean()
        std = SCALES[scale](union, own)
        centred = union - baseline
        adv = centred if std is None else centred / (std + eps)
        own_adv[i] = adv[:g]
        peer_adv.append(adv[g:])
    return own_adv, peer_adv


# 3. Row weights and the peer rows' token loss ----------------------------------------------

def cross_lower(s: HacpoSettings, update: int) -> float:
    """l_m = min(1, 1 − δ + m · δ_step): the lower clip of peer ratios at the round's update m
    (0-based, counting every optimizer step of the round)."""
    if update < 0:
        raise ValueError(f"update index must be non-negative, got {update}")
    return min(1.0, 1.0 - s.hacpo_delta + update * s.hacpo_delta_step)


def log_sequence_ratio(logp: Tensor, behaviour: Tensor, mask: Tensor,
                       max_log_ratio: float) -> Tensor:
    """``[B, 1]`` log s = mean over the row's real tokens of (log π_k − behaviour), clamped to
    ±max_log_ratio. ``behaviour`` holds the sender's *mean* log-prob on every token of its row,
    so this is mean_t log π_k(y_t) − mean_u log π_j(y_u)."""
    m = mask.to(logp.dtype)
    mean = ((logp - behaviour) * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)
    return mean.clamp(-max_log_ratio, max_log_ratio)


def cross_token_loss(logp: Tensor, behaviour: Tensor, advantages: Tensor, weights: Tensor,
                     mask: Tensor, s: HacpoSettings, update: int) -> TokenLoss:
    """Per-token loss of HACPO's peer rows (every token of a row carries the row's value):
    −clip(s, l_m, 1) · sg(clip(s, l_m, 1))^α · w · A, w the row weight clip(P_j / P_k)
    (``weights``, ``[B]`` or ``[B, T]``). The gradient flows through s only inside
    [l_m, 1]. No KL: it regularises the learner on its own samples."""
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    w = weights.unsqueeze(-1) if weights.dim() == 1 else weights
    ratio = torch.exp(log_sequence_ratio(logp, behaviour, mask, s.hacpo_max_log_ratio))
    lower = cross_lower(s, update)
    clamped = ratio.clamp(lower, 1.0)
    pg = (-(clamped * clamped.detach().pow(s.hacpo_alpha)) * adv * w.detach()).expand_as(logp)
    return TokenLoss(total=pg, pg=pg, kl=torch.zeros_like(pg),
                     clipped_low=(ratio < lower).expand_as(logp),
                     clipped_high=(ratio > 1.0).expand_as(logp))


class HacpoRows(Protocol):
    """What HACPO's row weights read of the peer rows (`probes.PeerRows` has it)."""

    sender_logp_sum: Tensor
    """[M] the sender's log-prob of the whole completion."""
    sender_tokens: Tensor | None
    """[M] how many sender tokens that sum covers."""
    capability: Tensor | None
    """[M] clip(P_j / P_k): the row weight."""


@dataclass
class CrossRows:
    """HACPO's peer rows before the first update: weights, behaviour and statistics."""

    weights: Tensor
    """[M, T] clip(P_j / P_k) on every token of its row."""
    behaviour: Tensor
    """[M, T] the sender's mean token log-prob on every token of its row."""
    stats: dict[str, float]


def sender_mean_logp(rows: HacpoRows, learner_tokens: Tensor,
                     length: Literal["sender", "learner"] = "sender") -> Tensor:
    """[M] the sender's log-prob of each row divided by a token count: its own (`sender`,
    eq. (59): the mean in the sender's tokenizer) or the learner's (`learner`, ``[M]``
    ``learner_tokens``: one length on both sides of the ratio, as PRP's sequence weight)."""
    if length == "learner":
        count = learner_tokens.to(rows.sender_logp_sum)
    elif rows.sender_tokens is None:
        raise ValueError("HACPO's peer rows need the sender's token count")
    else:
        count = rows.sender_tokens.to(rows.sender_logp_sum)
    return rows.sender_logp_sum / count.clamp(min=1.0)


def cross_rows(logp_old: Tensor, mask: Tensor, rows: HacpoRows, s: HacpoSettings) -> CrossRows:
    """Row weights and behaviour of the peer rows, and the pre-step ratio statistics
    (`hacpo_s_*`: the shares below l_0 and above 1, the mean log s, the mean row weight)."""
    send = sender_mean_logp(rows, mask.sum(-1), s.hacpo_ratio_length)
    send = send.to(logp_old).unsqueeze(-1).expand_as(logp_old)
    cap = (torch.ones(logp_old.shape[0], dtype=logp_old.dtype) if rows.capability is None
           else rows.capability.to(logp_old))
    log_s = log_sequence_ratio(logp_old.detach(), send, mask, s.hacpo_max_log_ratio).squeeze(-1)
    lower = cross_lower(s, 0)
    n = max(int(log_s.numel()), 1)
    stats = {"hacpo_s_below": float((log_s.exp() < lower).sum()) / n,
             "hacpo_s_above": float((log_s > 0).sum()) / n,
             "hacpo_log_s": float(log_s.mean()) if log_s.numel() else 0.0,
             "hacpo_row_weight": float(cap.mean()) if cap.numel() else 0.0}
    return CrossRows(weights=cap.unsqueeze(-1).expand_as(logp_old).clone(),
                     behaviour=send.clone(), stats=stats)
