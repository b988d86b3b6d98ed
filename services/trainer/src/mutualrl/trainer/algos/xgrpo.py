"""XGRPO: cross-policy advantage sharing through per-prompt reward statistics
(docs/design.md (6)).

Only (count, sum, sum of squares) per prompt cross the wire; each policy computes
A_ik = (r_ik - mean(U)) / (std(U) + eps) over the union U of every policy's rewards for the
prompt, and only its own tokens enter its loss.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mutualrl.trainer.algos.loss import EPS, group_advantages
from mutualrl.trainer.algos.modes import ScaleRewards


@dataclass(frozen=True)
class RewardStats:
    """Sufficient statistics of a set of rewards for one prompt (what SEE's REWARD_STATS holds)."""

    count: int = 0
    sum: float = 0.0
    sumsq: float = 0.0

    @classmethod
    def of(cls, rewards: Iterable[float]) -> RewardStats:
        values = [float(r) for r in rewards]
        return cls(len(values), math.fsum(values), math.fsum(v * v for v in values))

    def merge(self, other: RewardStats) -> RewardStats:
        """Pooling is addition of the three fields, so it is commutative and associative."""
        return RewardStats(self.count + other.count, self.sum + other.sum, self.sumsq + other.sumsq)

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else 0.0

    @property
    def var(self) -> float:
        """Population variance (ddof=0). E[r^2] - E[r]^2 can round below 0: clamp it."""
        if not self.count:
            return 0.0
        m = self.sum / self.count
        return max(self.sumsq / self.count - m * m, 0.0)

    @property
    def std(self) -> float:
        return math.sqrt(self.var)


def pool(stats: Iterable[RewardStats]) -> RewardStats:
    """Pool the statistics of several policies (or several groups) for one prompt."""
    total = RewardStats()
    for s in stats:
        total = total.merge(s)
    return total


def group_stats(rewards: Tensor) -> list[RewardStats]:
    """One RewardStats per row of ``[P, G]`` rewards (what a policy publishes each round)."""
    return [RewardStats.of(row) for row in rewards.tolist()]


def xgrpo_advantages(
    rewards: Tensor, peer_stats: Sequence[RewardStats | None], eps: float = EPS,
    scale: ScaleRewards = "group",
) -> Tensor:
    """Pooled advantages for own rewards ``[P, G]`` given the pooled peer stats of each prompt
    (docs/design.md (6)), divided by the pooled std (`scale` group), the std of the round's own
    rewards (batch) or nothing (none).

    Rows with no peer rewards (None or count 0) take exactly GRPO's values from
    ``group_advantages`` (same code path), so XGRPO with one policy is bitwise GRPO.
    Pooled rows are computed in float64 from the sums, then cast back.
    """
    if len(peer_stats) != rewards.shape[0]:
        raise ValueError(f"peer_stats has {len(peer_stats)} rows, rewards {rewards.shape[0]}")
    out = group_advantages(rewards, eps, scale)
    own = group_stats(rewards)
    batch_std = float(rewards.to(torch.float64).std(correction=0))
    for i, peer in enumerate(peer_stats):
        if peer is None or peer.count == 0:
            continue
        union = own[i].merge(peer)
        row = rewards[i].to(torch.float64)
        std = {"group": union.std, "batch": batch_std}.get(scale)
        centred = row - union.mean
        out[i] = (centred if std is None else centred / (std + eps)).to(rewards.dtype)
    return out


def baseline_shift(rewards: Tensor, peer_stats: Sequence[RewardStats | None]) -> float:
    """Mean over prompts with peer data of |mean(U) - mean(own)|: how much pooling moved the
    baseline (0.0 when no prompt had peer data)."""
    shifts = []
    for row, peer in zip(rewards.tolist(), peer_stats, strict=True):
        if peer is None or peer.count == 0:
            continue
        own = RewardStats.of(row)
        shifts.append(abs(own.merge(peer).mean - own.mean))
    return sum(shifts) / len(shifts) if shifts else 0.0
