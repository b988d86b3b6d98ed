"""MWRA's allocation does no work proportional to the pool's size: a pool is a number clients
send. `min_makespan` and `apportion` are checked against the one-value-at-a-time reference
rules they replace (kept here), and their work is counted, not timed."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mutualrl.mwra import allocation
from mutualrl.mwra.allocation import (
    MAX_COST,
    PolicySpec,
    PoolWorker,
    Settings,
    apportion,
    balanced_shares,
    makespan,
    min_makespan,
    plan_round,
    static_shares,
)


def scan_min_makespan(costs: Mapping[str, float], total: int,
                      minimums: Mapping[str, int]) -> float:
    """The rule as first written: every c_i / k, k = 1..N, in increasing order."""
    for t in sorted({c / k for c in costs.values() for k in range(1, total + 1)}):
        if t > 0 and sum(allocation._need(costs[p], t, minimums[p]) for p in costs) <= total:
            return t
    return 0.0


def loop_apportion(quotas: Mapping[str, float], total: int, minimums: Mapping[str, int],
                   base: Mapping[str, int] | None = None,
                   tiebreak: Mapping[str, float] | None = None) -> dict[str, int]:
    """Largest remainder as first written: one unit per step."""
    tb = tiebreak or {}
    shares = {p: max(int(minimums[p]), math.floor(q)) for p, q in quotas.items()}
    if base is not None:
        shares = {p: max(int(minimums[p]), int(base[p])) for p in quotas}
    while sum(shares.values()) < total:
        pick = min(quotas, key=lambda p: (-(quotas[p] - shares[p]), -tb.get(p, 0.0), p))
        shares[pick] += 1
    while sum(shares.values()) > total:
        above = [p for p in quotas if shares[p] > minimums[p]]
        pick = min(above, key=lambda p: (-(shares[p] - quotas[p]), tb.get(p, 0.0), p))
        shares[pick] -= 1
    return shares


cost = st.one_of(st.sampled_from([0.5, 1.0, 2.0, 3.0, 7.0]),
                 st.floats(min_value=0.01, max_value=1000.0, allow_nan=False))


@settings(max_examples=400, deadline=None)
@given(costs=st.lists(cost, min_size=1, max_size=6),
       mins=st.lists(st.integers(1, 6), min_size=6, max_size=6),
       extra=st.integers(0, 120))
@example(costs=[3.0, 1.0], mins=[1] * 6, extra=6)
@example(costs=[1.0, 1.0, 1.0], mins=[1] * 6, extra=0)
@example(costs=[1000.0, 0.01], mins=[5, 1, 1, 1, 1, 1], extra=3)
def test_min_makespan_equals_the_scan_of_every_candidate(costs: list[float], mins: list[int],
                                                         extra: int) -> None:
    ids = [f"p{i}" for i in range(len(costs))]
    c = dict(zip(ids, costs, strict=True))
    m = {p: mins[i] for i, p in enumerate(ids)}
    total = sum(m.values()) + extra
    assert min_makespan(c, total, m) == scan_min_makespan(c, total, m)


quota_weights = st.lists(st.floats(min_value=0.0, max_value=50.0, allow_nan=False),
                         min_size=1, max_size=6)


@settings(max_examples=400, deadline=None)
@given(weights=quota_weights, mins=st.lists(st.integers(1, 40), min_size=6, max_size=6),
       extra=st.integers(0, 60), use_base=st.booleans(),
       base_add=st.lists(st.integers(0, 30), min_size=6, max_size=6),
       tie=st.lists(st.sampled_from([0.0, 1.0, 2.0]), min_size=6, max_size=6))
@example(weights=[0.2, 0.2, 3.6], mins=[1] * 6, extra=0, use_base=False, base_add=[0] * 6,
         tie=[0.0] * 6)
def test_apportion_equals_the_unit_at_a_time_rule(weights: list[float], mins: list[int],
                                                  extra: int, use_base: bool,
                                                  base_add: list[int], tie: list[float]) -> None:
    ids = [f"p{i}" for i in range(len(weights))]
    m = {p: mins[i] // 4 + 1 for i, p in enumerate(ids)}
    total = sum(m.values()) + extra
    wsum = sum(weights) or 1.0
    q = {p: total * weights[i] / wsum for i, p in enumerate(ids)}
    base = {p: m[p] + base_add[i] for i, p in enumerate(ids)} if use_base else None
    tb = {p: tie[i] for i, p in enumerate(ids)}
    got = apportion(q, total, m, base=base, tiebreak=tb)
    assert got == loop_apportion(q, total, m, base=base, tiebreak=tb)
    assert sum(got.values()) == total and all(got[p] >= m[p] for p in ids)


class _Counter:
    """Counts `_need` evaluations: the unit of work of the makespan search."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = allocation._need

        def counted(cost: float, t: float, minimum: int) -> int:
            self.calls += 1
            return real(cost, t, minimum)

        monkeypatch.setattr(allocation, "_need", counted)


@pytest.mark.timeout(20)
def test_balanced_work_does_not_grow_with_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    counter = _Counter(monkeypatch)
    costs = {f"p{i}": 1.0 + (i * 7919) % 97 / 10 for i in range(40)}
    mins = dict.fromkeys(costs, 1)
    work = {}
    for total in (10**3, 10**6, 10**12):
        counter.calls = 0
        shares = balanced_shares(costs, total, mins)
        work[total] = counter.calls
        assert sum(shares.values()) == total
        # optimal: no unit moved from the slowest-finishing policy can help
        span = makespan(costs, shares)
        assert span <= min_makespan(costs, total, mins) * (1 + 1e-12)
        assert span == pytest.approx(sum(costs.values()) / total, rel=40 / total * 1e3 + 1e-9)
    # O(P log P) evaluations at every size: the same work for 10^12 units as for 10^3
    assert work[10**12] <= 2 * work[10**3] + 400, work
    assert work[10**12] < 40 * 40, work


@pytest.mark.timeout(20)
def test_static_and_take_back_do_not_step_through_units() -> None:
    # minimums that overshoot by ~10^11 units: take back in one pass, not 10^11 steps
    total = 10**12
    mins = {"a": 4 * 10**11, "b": 1, "c": 1}
    weights = {"a": 1.0, "b": 1000.0, "c": 3000.0}
    shares = static_shares(weights, total, mins)
    assert shares["a"] == 4 * 10**11 and sum(shares.values()) == total
    # the units a's minimum takes come from the largest surpluses: b and c end level
    q = {p: total * w / sum(weights.values()) for p, w in weights.items()}
    assert abs((shares["b"] - q["b"]) - (shares["c"] - q["c"])) <= 1
    # a base far below the pool: hand out ~10^12 units in one pass
    shares = apportion({"a": total / 4, "b": 3 * total / 4}, total, {"a": 1, "b": 1},
                       base={"a": 1, "b": 1})
    assert shares == {"a": total // 4, "b": 3 * total // 4}


@pytest.mark.timeout(20)
def test_plan_round_over_a_huge_pool_with_extreme_costs() -> None:
    # the case: 2^31-1 slots and a step of 1e308 s (capped at validation now; the pure
    # core must still answer, never NaN -> int)
    workers = [PoolWorker("w", 2**31 - 1, cpu_slots=2**31 - 1)]
    pols = [PolicySpec("a", cost=1e308 * 4), PolicySpec("b", cost=math.inf),
            PolicySpec("c", cost=math.nan), PolicySpec("d", cost=1e-300)]
    plan = plan_round(None, pols, workers, Settings(), 0)
    assert sum(plan.units.values()) == 2**31 - 1
    assert all(u >= 1 for u in plan.units.values())
    assert plan.costs["a"] == plan.costs["b"] == MAX_COST
    assert all(math.isfinite(c) for c in plan.costs.values())
