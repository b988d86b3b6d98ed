"""Summary statistics over seeds: mean with a Student-t 95% confidence interval, and paired
differences against the control. Pure: no I/O, no torch; the t quantile is scipy's."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from scipy import stats


def t_quantile_975(df: int) -> float:
    """The 97.5% quantile of Student's t with `df` degrees of freedom (a two-sided 95%
    interval's half-width in standard errors)."""
    if df < 1:
        raise ValueError("df must be >= 1")
    return float(stats.t.ppf(0.975, df))


@dataclass(frozen=True)
class Estimate:
    """Mean over n values with a 95% CI (lo == hi == mean when n == 1)."""

    mean: float
    lo: float
    hi: float
    n: int
    std: float

    def excludes_zero(self) -> bool:
        return self.n > 1 and (self.lo > 0 or self.hi < 0)

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)

    def fmt(self, signed: bool = False, digits: int = 3) -> str:
        """'0.512 [0.470, 0.554]'; signed=True for differences: '+0.133 [+0.101, +0.165]'."""
        spec = f"{'+' if signed else ''}.{digits}f"
        if self.n < 2:
            return format(self.mean, spec)
        return f"{self.mean:{spec}} [{self.lo:{spec}}, {self.hi:{spec}}]"


def mean_ci(values: Sequence[float]) -> Estimate:
    """Mean and the t-based 95% CI of the mean (sample std, ddof=1)."""
    n = len(values)
    if n == 0:
        raise ValueError("no values")
    mean = math.fsum(values) / n
    if n == 1:
        return Estimate(mean, mean, mean, 1, 0.0)
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    std = math.sqrt(var)
    half = t_quantile_975(n - 1) * std / math.sqrt(n)
    return Estimate(mean, mean - half, mean + half, n, std)


def paired_difference(treated: Sequence[float], control: Sequence[float]) -> Estimate:
    """CI of the mean of per-seed differences treated - control (seeds paired by position)."""
    if len(treated) != len(control):
        raise ValueError(f"unpaired: {len(treated)} treated vs {len(control)} control values")
    return mean_ci([t - c for t, c in zip(treated, control, strict=True)])
