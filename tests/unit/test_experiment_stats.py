import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mutualrl.experiment.stats import mean_ci, paired_difference, t_quantile_975


def test_mean_ci_matches_hand_computation() -> None:
    est = mean_ci([0.4, 0.5, 0.6])
    # mean 0.5, sample std 0.1, half width t(2) * 0.1 / sqrt(3)
    half = 4.303 * 0.1 / math.sqrt(3)
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
    assert t_quantile_975(1) == 12.706
    assert t_quantile_975(2) == 4.303
    assert t_quantile_975(100) == 1.96


@given(st.lists(st.floats(-1, 1), min_size=2, max_size=20))
def test_interval_contains_mean(values: list[float]) -> None:
    est = mean_ci(values)
    assert est.lo <= est.mean + 1e-12 and est.mean <= est.hi + 1e-12


def test_format() -> None:
    assert mean_ci([0.5]).fmt() == "0.500"
    assert paired_difference([0.2, 0.3], [0.1, 0.1]).fmt(signed=True).startswith("+0.150 [")
