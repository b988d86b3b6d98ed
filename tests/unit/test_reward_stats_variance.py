"""A REWARD_STATS record's count, sum and sum_sq must imply a variance that is not negative
(`mutualrl.common.records.check_stats`), with rounding room relative to the mean's square:
statistics computed from real rewards always pass, and any whose mean square falls short of
the squared mean by more than rounding can explain is refused naming `sum_sq`."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mutualrl.common import bounds
from mutualrl.common.errors import InvalidArgument
from mutualrl.common.records import check_stats

REWARD = st.floats(-bounds.MAX_ABS_REWARD, bounds.MAX_ABS_REWARD, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(REWARD, min_size=1, max_size=300), st.floats(-1e3, 1e3, allow_nan=False))
def test_stats_of_real_rewards_pass(rewards: list[float], spread: float) -> None:
    """As a trainer computes them (float64 sums), also for rewards close together around a
    large mean, where mean_sq - mean**2 cancels catastrophically."""
    for rs in (rewards, [rewards[0] + spread * i / len(rewards) for i in range(len(rewards))]):
        rs = [max(-bounds.MAX_ABS_REWARD, min(bounds.MAX_ABS_REWARD, r)) for r in rs]
        check_stats(len(rs), float(sum(rs)), float(sum(r * r for r in rs)), max(rs), "s")


@settings(max_examples=300, deadline=None)
@given(st.integers(1, bounds.MAX_GROUP_SIZE),
       st.floats(1e-3, bounds.MAX_ABS_REWARD).flatmap(lambda m: st.sampled_from([m, -m])),
       st.floats(1e-6, 1.0))
def test_a_negative_variance_is_refused(count: int, mean: float, short: float) -> None:
    """sum_sq/count short of mean**2 by a fraction `short` of it (at least 1e-6, a thousand
    times the rounding room) is refused, whatever the scale."""
    with pytest.raises(InvalidArgument) as err:
        check_stats(count, mean * count, count * mean * mean * (1 - short), abs(mean), "s")
    assert err.value.field == "s.sum_sq"
    assert "negative variance" in err.value.message


def test_the_large_mean_case_once_accepted_is_refused() -> None:
    """count 2^20, mean 1e9: a tolerance of 1e-9 * sum_sq (1e15) let a variance of -1.05e15
    through."""
    count = 1 << 20
    with pytest.raises(InvalidArgument) as err:
        check_stats(count, count * 1e9, 1.04748e24, 1e9, "records[0].stats")
    assert err.value.field == "records[0].stats.sum_sq"
