"""MWRA's planning of rollout workers and of an over-committed CPU pool by cost (pure math)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from mutualrl.mwra.allocation import (
    PolicySpec,
    PoolAssignment,
    PoolWorker,
    Settings,
    plan_round,
    rollout_split,
    scaling_cap,
    shared_makespan,
    shared_shares,
)

cost = st.floats(min_value=0.01, max_value=1000.0, allow_nan=False)


def test_a_slow_policy_takes_the_threads_its_waiting_peers_leave_idle() -> None:
    """Three policies on two cores, one round costing 52 thread-seconds and its peers 11 and 1
    (their waits for it excluded): the slow one gets both threads, the others keep one."""
    pols = [PolicySpec("smol", cost=52.0), PolicySpec("llama", cost=11.0),
            PolicySpec("qwen", cost=1.0)]
    plan = plan_round(None, pols, [PoolWorker("local", 2, cpu_slots=2)],
                      Settings(short_pool="shared"), 0)
    assert plan.strategy == "shared" and plan.active == ["llama", "qwen", "smol"]
    assert plan.units == {"smol": 2, "llama": 1, "qwen": 1}
    assert plan.threads == {"smol": 2, "llama": 1, "qwen": 1}
    # the round's estimate falls from smol's 52 s alone to the pooled 64 / 2 = 32 s
    assert shared_makespan(plan.costs, plan.units, 2) == 32.0


def test_threads_that_made_a_round_slower_go_back() -> None:
    """On a busy machine smol's round took 116 s on 2 threads against 52 s on one: it keeps
    one thread, however large its cost (unit-seconds) grew."""
    slower = {1: 52.0, 2: 116.0}
    pols = [PolicySpec("smol", cost=232.0, seconds_by_units=slower),
            PolicySpec("llama", cost=11.0), PolicySpec("qwen", cost=1.0)]
    pool = [PoolWorker("local", 2, cpu_slots=2)]
    before = plan_round(None, [PolicySpec("smol", cost=52.0), *pols[1:]], pool,
                        Settings(short_pool="shared"), 0)
    assert before.units["smol"] == 2
    plan = plan_round(before, pols, pool, Settings(short_pool="shared"), 1)
    assert plan.units == {"smol": 1, "llama": 1, "qwen": 1}
    # a faster round on 2 threads keeps them
    faster = PolicySpec("smol", cost=64.0, seconds_by_units={1: 52.0, 2: 32.0})
    assert plan_round(before, [faster, *pols[1:]], pool, Settings(short_pool="shared"),
                      1).units["smol"] == 2


@given(st.dictionaries(st.integers(1, 16), cost, max_size=6))
def test_scaling_cap_is_the_last_count_that_paid(seconds: dict[int, float]) -> None:
    cap = scaling_cap(seconds)
    counts = sorted(seconds)
    paid = all(seconds[b] < seconds[a] for i, a in enumerate(counts) for b in counts[i + 1:])
    if paid:
        assert cap is None
    else:
        assert cap in seconds and any(seconds[b] >= seconds[cap] for b in counts if b > cap)
        # below the cap every step up paid
        below = [u for u in counts if u < cap]
        assert all(seconds[b] < seconds[a] for i, a in enumerate(below)
                   for b in counts[i + 1:])


@settings(max_examples=200, deadline=None)
@given(costs=st.lists(cost, min_size=2, max_size=8), total=st.integers(1, 7),
       mins=st.data())
def test_shared_threads_are_the_fewest_that_fit_the_pooled_round(costs: list[float], total: int,
                                                                 mins: st.DataObject) -> None:
    ids = [f"p{i}" for i in range(len(costs))]
    c = dict(zip(ids, costs, strict=True))
    m = {p: mins.draw(st.integers(1, total)) for p in ids}
    units = shared_shares(c, total, m, total)
    pooled = sum(costs) / total
    for p in ids:
        assert m[p] <= units[p] <= total
        # enough threads: its own round fits in the pooled one (unless the worker is full)
        assert units[p] == total or c[p] / units[p] <= pooled * (1 + 1e-9)
        # and no more than that: one thread fewer would not fit (or breaks the minimum)
        assert units[p] == m[p] or c[p] / (units[p] - 1) > pooled * (1 - 1e-9)
    if all(u < total for u in units.values()):
        assert math.isclose(shared_makespan(c, units, total), pooled)


@settings(max_examples=300, deadline=None)
@given(units=st.integers(1, 64), r=cost, u=cost, workers=st.integers(0, 8),
       devices=st.booleans())
def test_rollout_split_is_within_bounds_and_balances_the_two_phases(
        units: int, r: float, u: float, workers: int, devices: bool) -> None:
    share, n = rollout_split(units, r, u, workers, devices)
    if workers == 0 or units < 2:
        assert (share, n) == (0, 0)
        return
    assert 1 <= share <= units - 1 and 1 <= n <= min(workers, share)
    if devices:
        assert n == share <= workers  # one device per rollout worker
        return
    # the best integer split: no other r finishes both phases sooner
    def span(k: int) -> float:
        return max(r / k, u / (units - k))
    assert span(share) <= min(span(k) for k in range(1, units)) * (1 + 1e-12)
    exact = units * r / (r + u)
    assert abs(share - min(max(exact, 1), units - 1)) < 1.0


def test_rollout_split_before_measurements_halves_the_units() -> None:
    assert rollout_split(8, None, None, 1, devices=False) == (4, 1)
    assert rollout_split(8, 3.0, None, 2, devices=False) == (4, 2)
    assert rollout_split(1, 3.0, 1.0, 4, devices=False) == (0, 0)
    # rollouts three times the update: 6 of 8 threads generate, 2 update
    assert rollout_split(8, 3.0, 1.0, 1, devices=False) == (6, 1)
    assert rollout_split(8, 3.0, 1.0, 2, devices=True) == (2, 2)


@settings(max_examples=150, deadline=None)
@given(specs=st.lists(st.tuples(cost, cost, cost, st.integers(0, 3), st.integers(1, 3)),
                      min_size=1, max_size=5),
       sizes=st.lists(st.integers(1, 16), min_size=1, max_size=3), gpu=st.booleans(),
       shared=st.booleans())
def test_plans_conserve_units_and_split_each_policy_within_its_share(
        specs: list[tuple[float, float, float, int, int]], sizes: list[int], gpu: bool,
        shared: bool) -> None:
    pols = [PolicySpec(f"p{i}", min_units=m, cost=c, rollout_cost=r, update_cost=u,
                       max_rollout_workers=w) for i, (c, r, u, w, m) in enumerate(specs)]
    pool = [PoolWorker(f"w{i}", n, cpu_slots=4 * n if gpu else n) for i, n in enumerate(sizes)]
    cfg = Settings(short_pool="shared" if shared else "time-share", unit="gpu" if gpu else "cpu")
    plan: PoolAssignment | None = None
    for k in range(2):
        plan = plan_round(plan, pols, pool, cfg, k)
        total = sum(sizes)
        if plan.strategy == "balanced":
            assert sum(plan.units.values()) == total  # units conserved
        for p in pols:
            pid, units = p.policy_id, plan.units[p.policy_id]
            if pid in plan.active:
                # shared: a policy's units lie on one worker, which may hold fewer than m_i
                assert units >= (1 if plan.strategy == "shared" else min(p.min_units, total))
            r, n, t = plan.rollout_units[pid], plan.rollout_workers[pid], plan.rollout_threads[pid]
            assert 0 <= r <= max(units - 1, 0) and n <= min(p.max_rollout_workers, max(r, 0))
            assert (r == 0) == (n == 0)
            if r:
                assert 1 <= t <= plan.threads[pid] - 1  # learner and workers both run
            if p.max_rollout_workers == 0 or units < 2:
                assert (r, n, t) == (0, 0, 0)
    assert plan is not None and PoolAssignment.from_json(plan.to_json()) == plan


def test_shared_threads_do_not_move_for_a_small_gain() -> None:
    """Two policies of nearly equal cost trade places: the old split's round (30 s) is within
    the 10% hysteresis of the new one's (29.5 s), so the threads stay; without it they move."""
    pool = [PoolWorker("local", 2, cpu_slots=2)]

    def specs(smol: float, llama: float) -> list[PolicySpec]:
        return [PolicySpec("smol", cost=smol), PolicySpec("llama", cost=llama),
                PolicySpec("qwen", cost=1.0)]

    first = plan_round(None, specs(30.0, 28.0), pool, Settings(short_pool="shared"), 0)
    assert first.units == {"smol": 2, "llama": 1, "qwen": 1}
    kept = plan_round(first, specs(28.0, 30.0), pool, Settings(short_pool="shared"), 1)
    assert kept.units == first.units and kept.epoch == first.epoch
    moved = plan_round(first, specs(28.0, 30.0), pool,
                       Settings(short_pool="shared", hysteresis=0.0), 1)
    assert moved.units == {"smol": 1, "llama": 2, "qwen": 1} and moved.epoch == 2


def test_rollout_workers_move_when_a_worker_is_lost_or_a_peer_leaves() -> None:
    a = PolicySpec("a", cost=8.0, rollout_cost=6.0, update_cost=2.0, max_rollout_workers=1)
    b = PolicySpec("b", cost=8.0)
    two = [PoolWorker("w0", 4, cpu_slots=4), PoolWorker("w1", 4, cpu_slots=4)]
    plan = plan_round(None, [a, b], two, Settings(), 0)
    assert (plan.units["a"], plan.rollout_threads["a"], plan.rollout_workers["a"]) == (4, 3, 1)
    assert plan.rollout_workers["b"] == 0
    # w1's lease lapsed: a holds 2 threads, one for its worker, one for its learner
    plan = plan_round(plan, [a, b], two[:1], Settings(), 1)
    assert (plan.units["a"], plan.rollout_threads["a"], plan.rollout_workers["a"]) == (2, 1, 1)
    # b finished: a takes the pool and its worker most of it
    plan = plan_round(plan, [a], two[:1], Settings(), 2)
    assert (plan.units["a"], plan.rollout_threads["a"], plan.rollout_workers["a"]) == (4, 3, 1)
    # one thread left: rollouts in-process
    plan = plan_round(plan, [a], [PoolWorker("w0", 1, cpu_slots=1)], Settings(), 3)
    assert (plan.units["a"], plan.rollout_threads["a"], plan.rollout_workers["a"]) == (1, 0, 0)


def test_the_rollout_split_keeps_still_for_a_small_gain() -> None:
    """Rollouts 5.6 and update 2.4 unit-s on 8 units: 5 rollout units finish in 1.12 s, the
    previous 6 in 1.2 s, within the 10% hysteresis: the split stays; without it, it moves."""
    assert rollout_split(8, 5.6, 2.4, 1, devices=False) == (5, 1)
    assert rollout_split(8, 5.6, 2.4, 1, devices=False, previous=6, hysteresis=0.1) == (6, 1)
    assert rollout_split(8, 5.6, 2.4, 1, devices=False, previous=7, hysteresis=0.1) == (5, 1)
    pool = [PoolWorker("w", 8, cpu_slots=8)]
    first = plan_round(None, [PolicySpec("a", cost=8.0, rollout_cost=6.0, update_cost=2.0,
                                         max_rollout_workers=1)], pool, Settings(), 0)
    assert first.rollout_units["a"] == 6
    drifted = [PolicySpec("a", cost=8.0, rollout_cost=5.6, update_cost=2.4,
                          max_rollout_workers=1)]
    kept = plan_round(first, drifted, pool, Settings(), 1)
    assert kept.rollout_units["a"] == 6 and kept.epoch == first.epoch
    moved = plan_round(first, drifted, pool, Settings(hysteresis=0.0), 1)
    assert moved.rollout_units["a"] == 5 and moved.epoch == first.epoch + 1
