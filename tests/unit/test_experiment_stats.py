import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mutualrl.experiment.stats import mean_ci, paired_difference, t_quantile_975


def test_mean_ci_matches_hand_computation() -> None:
    est = mean_ci([0.4, 0.5, 0.6])
    # mean 0.5, sample std 0.1, half width t(2) * 0.1 / sqrt(3)
    half = 4.302653 * 0.1 / math.sqrt(3)
    assert est.mean == pytest.approx(0.5)
    assert est.std == pytest.approx(0.1)
    assert est.lo == pytest.approx(0.5 - half) and est.hi == pytest.approx(0.5 + half)
    assert est.excludes_zero()


def test_single_value_has_degenerate_interval() -> None:
    est = mean_ci([0.3])
    assert (est.lo, est.mean, est.hi, est.n) == (0.3, 0.3, 0.3, 1)
    assert not est.excludes_zero()


def test_paired_difference_uses_per_seed_differences() -> None:
    # Seed effects are large, the treatment effect is a constant +0.1: the paired CI is tight.
    control = [0.1, 0.5, 0.9]
    treated = [0.2, 0.6, 1.0]
    est = paired_difference(treated, control)
    assert est.mean == pytest.approx(0.1)
    assert est.hi - est.lo == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="unpaired"):
        paired_difference([0.1], [0.1, 0.2])


def test_t_quantiles() -> None:
    # Student's t tables: 12.706, 4.303, 2.042 (df 30), 1.984 (df 100); the normal's 1.960.
    assert t_quantile_975(1) == pytest.approx(12.7062, abs=1e-4)
    assert t_quantile_975(2) == pytest.approx(4.3027, abs=1e-4)
    assert t_quantile_975(30) == pytest.approx(2.0423, abs=1e-4)
    assert t_quantile_975(100) == pytest.approx(1.9840, abs=1e-4)
    assert t_quantile_975(10**6) == pytest.approx(1.95996, abs=1e-4)
    with pytest.raises(ValueError, match="df"):
        t_quantile_975(0)


@given(st.lists(st.floats(-1, 1), min_size=2, max_size=20))
def test_interval_contains_mean(values: list[float]) -> None:
    est = mean_ci(values)
    assert est.lo <= est.mean + 1e-12 and est.mean <= est.hi + 1e-12


def test_format() -> None:
    assert mean_ci([0.5]).fmt() == "0.500"
    assert paired_difference([0.2, 0.3], [0.1, 0.1]).fmt(signed=True).startswith("+0.150 [")
