"""XGRPO: pooled reward statistics and pooled advantages; one policy is bitwise GRPO."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mutualrl.trainer.algos.loss import EPS, group_advantages
from mutualrl.trainer.algos.xgrpo import (
    RewardStats,
    baseline_shift,
    group_stats,
    pool,
    xgrpo_advantages,
)

torch.set_num_threads(1)

rewards_st = st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=8)


def test_stats_of_group() -> None:
    s = RewardStats.of([1.0, 0.0, 0.5])
    assert (s.count, s.sum, s.sumsq) == (3, 1.5, 1.25)
    assert s.mean == 0.5
    assert abs(s.var - (1.25 / 3 - 0.25)) < 1e-15
    assert group_stats(torch.tensor([[1.0, 0.0], [1.0, 1.0]])) == [
        RewardStats(2, 1.0, 1.0),
        RewardStats(2, 2.0, 2.0),
    ]


def test_variance_clamped_at_zero() -> None:
    # 0.1 * 3: sumsq/n - mean^2 rounds to -1.7e-18 in float64.
    s = RewardStats.of([0.1, 0.1, 0.1])
    assert s.sumsq / s.count - s.mean**2 < 0
    assert s.var == 0.0 and s.std == 0.0


def test_one_policy_is_bitwise_grpo() -> None:
    g = torch.Generator().manual_seed(0)
    r = torch.randint(0, 2, (16, 8), generator=g).float()
    r[3] = torch.rand(8, generator=g)
    assert torch.equal(xgrpo_advantages(r, [None] * 16), group_advantages(r))
    assert torch.equal(xgrpo_advantages(r, [RewardStats()] * 16), group_advantages(r))


def test_pooled_advantages_by_hand() -> None:
    own = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    peer = RewardStats.of([1.0, 1.0, 1.0, 0.0])
    adv = xgrpo_advantages(own, [peer])
    # Union: 4 ones of 8 -> mean 0.5, population std 0.5.
    expected = torch.tensor([[-0.5, -0.5, 0.5, -0.5]]) / (0.5 + EPS)
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-7)
    assert abs(baseline_shift(own, [peer]) - 0.25) < 1e-12
    assert baseline_shift(own, [None]) == 0.0


def test_all_fail_group_gets_negative_advantage_when_peers_succeed() -> None:
    """What docs/science-notes.md predicts: pooling only pushes an all-fail group down."""
    adv = xgrpo_advantages(torch.zeros(1, 4), [RewardStats.of([1.0] * 4)])
    assert bool((adv < 0).all())
    assert torch.equal(group_advantages(torch.zeros(1, 4)), torch.zeros(1, 4))


@settings(max_examples=60, deadline=None)
@given(rewards_st.filter(lambda r: len(r) >= 2), rewards_st)
def test_pooled_equals_grpo_over_union(own: list[float], peer: list[float]) -> None:
    o = torch.tensor([own], dtype=torch.float64)
    union = group_advantages(torch.tensor(own + peer, dtype=torch.float64))
    got = xgrpo_advantages(o, [RewardStats.of(peer)])
    # Sums vs two-pass differ by rounding; relative to 1/(std+eps) it stays tiny.
    torch.testing.assert_close(got[0], union[: len(own)], rtol=1e-6, atol=1e-4)


@settings(max_examples=60, deadline=None)
@given(rewards_st, rewards_st, rewards_st)
def test_pool_commutative_associative(a: list[float], b: list[float], c: list[float]) -> None:
    sa, sb, sc = RewardStats.of(a), RewardStats.of(b), RewardStats.of(c)
    assert sa.merge(sb) == sb.merge(sa)
    left, right = sa.merge(sb).merge(sc), sa.merge(sb.merge(sc))
    assert left.count == right.count
    assert math.isclose(left.sum, right.sum, rel_tol=1e-12, abs_tol=1e-12)
    assert math.isclose(left.sumsq, right.sumsq, rel_tol=1e-12, abs_tol=1e-12)
    whole = RewardStats.of(a + b + c)
    assert pool([sa, sb, sc]).count == whole.count
    assert math.isclose(pool([sa, sb, sc]).sum, whole.sum, rel_tol=1e-12, abs_tol=1e-12)
    assert pool([sa, sb, sc]).var >= 0.0
