"""Pure allocation math of MWRA: sums, minimums, monotonicity, brute-force optimality, turns."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mutualrl.mwra.allocation import (
    PolicySpec,
    PoolAssignment,
    PoolWorker,
    Settings,
    apportion,
    balanced_shares,
    ema,
    idle_fraction,
    makespan,
    min_makespan,
    next_turn_plan,
    place,
    plan_round,
    round_done,
    round_turns,
    static_shares,
    turn,
)

costs_st = st.lists(st.floats(min_value=0.05, max_value=100.0, allow_nan=False), min_size=1,
                    max_size=5)


def _ids(n: int) -> list[str]:
    return [f"p{i}" for i in range(n)]


def brute_force(costs: dict[str, float], total: int, mins: dict[str, int]) -> float:
    """Least makespan over every integer split of `total` (each >= its minimum)."""
    ids = sorted(costs)
    best = math.inf
    for split in itertools.product(range(1, total + 1), repeat=len(ids)):
        if sum(split) != total or any(u < mins[p] for p, u in zip(ids, split, strict=True)):
            continue
        best = min(best, max(costs[p] / u for p, u in zip(ids, split, strict=True)))
    return best


def test_worked_example_three_to_one_on_eight_units() -> None:
    shares = balanced_shares({"a": 3.0, "b": 1.0}, 8, {"a": 1, "b": 1})
    assert shares == {"a": 6, "b": 2}
    assert makespan({"a": 3.0, "b": 1.0}, shares) == pytest.approx(0.5)
    assert makespan({"a": 3.0, "b": 1.0}, {"a": 4, "b": 4}) == pytest.approx(0.75)
    assert idle_fraction({"a": 3.0, "b": 1.0}, shares) == pytest.approx(0.0)
    # static 4/4: b finishes at 0.25 and idles 0.5 of 0.75 on 4 of 8 units -> 1/3 idle
    assert idle_fraction({"a": 3.0, "b": 1.0}, {"a": 4, "b": 4}) == pytest.approx(1 / 3)


@settings(max_examples=200, deadline=None)
@given(costs=costs_st, extra=st.integers(min_value=0, max_value=12),
       minimum=st.integers(min_value=1, max_value=3))
def test_balanced_sums_to_pool_and_respects_minimums(costs: list[float], extra: int,
                                                      minimum: int) -> None:
    ids = _ids(len(costs))
    mins = {p: minimum for p in ids}
    total = minimum * len(ids) + extra
    shares = balanced_shares(dict(zip(ids, costs, strict=True)), total, mins)
    assert sum(shares.values()) == total
    assert all(shares[p] >= minimum for p in ids)


@settings(max_examples=200, deadline=None)
@given(weights=costs_st, extra=st.integers(min_value=0, max_value=12))
def test_static_sums_to_pool_respects_minimums_and_is_within_one_of_quota(
        weights: list[float], extra: int) -> None:
    ids = _ids(len(weights))
    total = len(ids) + extra
    w = dict(zip(ids, weights, strict=True))
    shares = static_shares(w, total, dict.fromkeys(ids, 1))
    assert sum(shares.values()) == total
    assert all(shares[p] >= 1 for p in ids)
    wsum = sum(weights)
    quotas = {p: total * w[p] / wsum for p in ids}
    binding = any(q < 1 for q in quotas.values())
    for p in ids:
        # never a unit above the quota unless held up by the minimum; when no minimum binds,
        # Hamilton rounding keeps every share within one unit of its quota
        assert shares[p] == 1 or shares[p] < quotas[p] + 1 + 1e-9
        if not binding:
            assert abs(shares[p] - quotas[p]) < 1 + 1e-9


@settings(max_examples=300, deadline=None)
@given(costs=st.lists(st.floats(min_value=0.1, max_value=20.0, allow_nan=False), min_size=1,
                      max_size=4),
       extra=st.integers(min_value=0, max_value=6),
       mins=st.lists(st.integers(min_value=1, max_value=2), min_size=4, max_size=4))
def test_balanced_matches_brute_force_min_makespan(costs: list[float], extra: int,
                                                   mins: list[int]) -> None:
    ids = _ids(len(costs))
    c = dict(zip(ids, costs, strict=True))
    m = {p: mins[i] for i, p in enumerate(ids)}
    total = sum(m.values()) + extra
    shares = balanced_shares(c, total, m)
    best = brute_force(c, total, m)
    assert makespan(c, shares) == pytest.approx(best, rel=1e-9)
    assert min_makespan(c, total, m) == pytest.approx(best, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(costs=costs_st, extra=st.integers(min_value=0, max_value=12))
def test_balanced_shares_are_monotone_in_cost(costs: list[float], extra: int) -> None:
    ids = _ids(len(costs))
    c = dict(zip(ids, costs, strict=True))
    total = len(ids) + extra
    shares = balanced_shares(c, total, dict.fromkeys(ids, 1))
    for a, b in itertools.permutations(ids, 2):
        if c[a] > c[b]:
            assert shares[a] >= shares[b], (c, shares)
        if c[a] == c[b]:
            assert abs(shares[a] - shares[b]) <= 1


@settings(max_examples=150, deadline=None)
@given(costs=st.lists(st.floats(min_value=0.05, max_value=100.0), min_size=2, max_size=5),
       extra=st.integers(min_value=0, max_value=12), bump=st.floats(min_value=1.0, max_value=10.0),
       which=st.integers(min_value=0, max_value=4))
def test_raising_a_policys_cost_never_lowers_its_share(costs: list[float], extra: int,
                                                       bump: float, which: int) -> None:
    ids = _ids(len(costs))
    i = ids[which % len(ids)]
    total = len(ids) + extra
    before = balanced_shares(dict(zip(ids, costs, strict=True)), total, dict.fromkeys(ids, 1))
    raised = dict(zip(ids, costs, strict=True))
    raised[i] *= bump
    after = balanced_shares(raised, total, dict.fromkeys(ids, 1))
    assert after[i] >= before[i]


@settings(max_examples=100, deadline=None)
@given(costs=costs_st, extra=st.integers(min_value=0, max_value=12))
def test_balanced_is_deterministic_and_order_independent(costs: list[float], extra: int) -> None:
    ids = _ids(len(costs))
    total = len(ids) + extra
    forward = balanced_shares(dict(zip(ids, costs, strict=True)), total, dict.fromkeys(ids, 1))
    backward = balanced_shares(dict(reversed(list(zip(ids, costs, strict=True)))), total,
                               dict.fromkeys(ids, 1))
    assert forward == backward
    assert forward == balanced_shares(dict(zip(ids, costs, strict=True)), total,
                                      dict.fromkeys(ids, 1))


def test_apportion_takes_back_when_minimums_overshoot() -> None:
    # quotas 0.2 / 0.2 / 3.6 on 4 units, minimums 1: floors + minimums give 1+1+3 = 5 > 4
    shares = apportion({"a": 0.2, "b": 0.2, "c": 3.6}, 4, {"a": 1, "b": 1, "c": 1})
    assert shares == {"a": 1, "b": 1, "c": 2}
    with pytest.raises(ValueError, match="minimums exceed"):
        apportion({"a": 1.0, "b": 1.0}, 1, {"a": 1, "b": 1})


@settings(max_examples=150, deadline=None)
@given(n_policies=st.integers(min_value=2, max_value=9), data=st.data())
def test_time_share_gives_every_policy_turns_round_robin(n_policies: int,
                                                         data: st.DataObject) -> None:
    total = data.draw(st.integers(min_value=1, max_value=n_policies - 1))
    ids = _ids(n_policies)
    pols = [PolicySpec(p, cost=1.0 + i) for i, p in enumerate(ids)]
    workers = [PoolWorker("w", total, cpu_slots=total)]
    plan: PoolAssignment | None = None
    turns = dict.fromkeys(ids, 0)
    per_cycle = math.ceil(n_policies / total)
    for k in range(3 * per_cycle * n_policies):
        plan = plan_round(plan, pols, workers, Settings(strategy="balanced"), k)
        assert plan.strategy == "time-share"
        assert sum(plan.units.values()) == total  # the whole pool is used every round
        assert len(plan.active) == total  # min 1 each: as many policies as units
        for p in ids:
            assert (plan.units[p] >= 1) == (p in plan.active)
            turns[p] += p in plan.active
        # round-robin: turn counts never differ by more than one
        assert max(turns.values()) - min(turns.values()) <= 1
    assert min(turns.values()) >= 3 * total


@settings(max_examples=150, deadline=None)
@given(mins=st.lists(st.integers(min_value=1, max_value=6), min_size=2, max_size=7),
       total=st.integers(min_value=1, max_value=5))
def test_time_share_with_uneven_minimums_gives_everyone_a_turn_every_p_rounds(
        mins: list[int], total: int) -> None:
    ids = _ids(len(mins))
    pols = [PolicySpec(p, min_units=m) for p, m in zip(ids, mins, strict=True)]
    workers = [PoolWorker("w", total, cpu_slots=total)]
    plan: PoolAssignment | None = None
    history: list[list[str]] = []
    for k in range(3 * len(ids)):
        plan = plan_round(plan, pols, workers, Settings(strategy="time-share"), k)
        assert sum(plan.units.values()) == total and plan.active
        for p in plan.active:  # each active policy gets its minimum (clamped to the pool)
            assert plan.units[p] >= min(mins[ids.index(p)], total)
        history.append(plan.active)
    for start in range(len(history) - len(ids) + 1):
        window = {p for active in history[start:start + len(ids)] for p in active}
        assert window == set(ids)


def test_time_share_ring_and_turn_policies_limit() -> None:
    ids = ["a", "b", "c", "d", "e"]
    mins = dict.fromkeys(ids, 1)
    assert turn(ids, mins, 2, None) == (["a", "b"], "c")
    assert turn(ids, mins, 2, "c") == (["c", "d"], "e")
    assert turn(ids, mins, 2, "e") == (["a", "e"], "b")  # wraps around the ring
    assert turn(ids, mins, 10, None, max_active=1) == (["a"], "b")
    # a policy whose minimum exceeds the pool still gets the whole pool on its turn
    assert turn(["a", "b"], {"a": 9, "b": 1}, 4, None) == (["a"], "b")
    workers = [PoolWorker("w", 8, 8)]
    pols = [PolicySpec(p) for p in ids[:3]]
    plan = None
    seen = []
    for k in range(3):
        plan = plan_round(plan, pols, workers, Settings(strategy="time-share", turn_policies=1),
                          k)
        seen.append((plan.active, plan.units))
    assert seen == [(["a"], {"a": 8, "b": 0, "c": 0}), (["b"], {"a": 0, "b": 8, "c": 0}),
                    (["c"], {"a": 0, "b": 0, "c": 8})]


def test_hysteresis_keeps_split_under_small_cost_changes() -> None:
    workers = [PoolWorker("w", 8, 8)]
    s = Settings(strategy="balanced", hysteresis=0.2)
    plan = plan_round(None, [PolicySpec("a", cost=3.0), PolicySpec("b", cost=1.0)], workers, s, 0)
    assert plan.units == {"a": 6, "b": 2} and plan.epoch == 1
    # for 2.2:1 the optimum is 5/3 (makespan 0.44) but 6/2 (0.5) is within 20% of it
    plan2 = plan_round(plan, [PolicySpec("a", cost=2.2), PolicySpec("b", cost=1.0)], workers, s,
                       1)
    assert plan2.units == {"a": 6, "b": 2} and plan2.epoch == 1 and plan2.round == 1
    # costs flip 1:3 -> old split has makespan 1.5 vs optimum 0.5: move
    plan3 = plan_round(plan2, [PolicySpec("a", cost=1.0), PolicySpec("b", cost=3.0)], workers, s,
                       2)
    assert plan3.units == {"a": 2, "b": 6} and plan3.epoch == 2
    no_h = plan_round(plan, [PolicySpec("a", cost=2.2), PolicySpec("b", cost=1.0)], workers,
                      Settings(strategy="balanced", hysteresis=0.0), 1)
    assert no_h.units == {"a": 5, "b": 3} and no_h.epoch == 2


def test_static_uses_weights_and_ignores_costs() -> None:
    workers = [PoolWorker("w", 9, 9)]
    pols = [PolicySpec("a", weight=2.0, cost=100.0), PolicySpec("b", weight=1.0, cost=1.0)]
    plan = plan_round(None, pols, workers, Settings(strategy="static"), 0)
    assert plan.units == {"a": 6, "b": 3} and plan.strategy == "static"


def test_placement_is_sticky_and_covers_units() -> None:
    workers = [PoolWorker("g0", 4, 32, "10.0.0.1:30000"), PoolWorker("g1", 4, 32, "10.0.0.2:30000")]
    first = place({"a": 4, "b": 4}, workers)
    assert first == {"a": {"g0": 4}, "b": {"g1": 4}}
    # b keeps g1 when it shrinks, a grows onto g1's freed units
    second = place({"a": 5, "b": 3}, workers, first)
    assert second == {"a": {"g0": 4, "g1": 1}, "b": {"g1": 3}}
    # a lost worker: previous holdings there are dropped, the rest stays put
    third = place({"a": 2, "b": 2}, [workers[1]], second)
    assert third == {"a": {"g1": 2}, "b": {"g1": 2}}


def test_lost_worker_and_released_policy_replan_over_the_live_pool() -> None:
    s = Settings(strategy="balanced")
    w = [PoolWorker("w1", 4, 4), PoolWorker("w2", 4, 4)]
    pols = [PolicySpec("a", cost=1.0), PolicySpec("b", cost=1.0)]
    plan = plan_round(None, pols, w, s, 0)
    assert plan.units == {"a": 4, "b": 4} and plan.pool_units == 8
    plan = plan_round(plan, pols, w[:1], s, 1)
    assert plan.units == {"a": 2, "b": 2} and plan.workers == ["w1"] and plan.epoch == 2
    assert all("w2" not in ws for ws in plan.placement.values())
    assert plan.threads == {"a": 2, "b": 2}  # CPU mode: threads are the units
    plan = plan_round(plan, pols[:1], w[:1], s, 2)
    assert plan.units == {"a": 4} and plan.idle_units == 0


def test_empty_pool_plan_is_empty_and_json_round_trips() -> None:
    plan = plan_round(None, [PolicySpec("a")], [], Settings(), 3)
    assert plan.empty and plan.units == {"a": 0} and plan.active == []
    full = plan_round(plan, [PolicySpec("a")], [PoolWorker("w", 2, 2)], Settings(), 3)
    assert PoolAssignment.from_json(full.to_json()) == full


def test_ema() -> None:
    assert ema(None, 5.0, 0.3) == 5.0
    assert ema(10.0, 0.0, 0.25) == pytest.approx(7.5)
    with pytest.raises(ValueError):
        ema(1.0, 1.0, 0.0)


def test_cluster_mode_threads_and_rollout_addresses() -> None:
    # GPU units: 2 workers with 4 GPUs and 32 CPU slots; a rollout server on g1 only
    pool = [PoolWorker("g0", 4, 32), PoolWorker("g1", 4, 32, "10.0.0.2:30000")]
    pols = [PolicySpec("a", cost=3.0), PolicySpec("b", cost=1.0)]
    plan = plan_round(None, pols, pool, Settings(strategy="balanced"), 0)
    assert plan.units == {"a": 6, "b": 2}
    assert plan.placement == {"a": {"g0": 4, "g1": 2}, "b": {"g1": 2}}
    assert plan.threads == {"a": 32 + 16, "b": 16}
    assert plan.rollout == {"g1": "10.0.0.2:30000"}


@settings(max_examples=100, deadline=None)
@given(n_policies=st.integers(min_value=2, max_value=9), data=st.data())
def test_short_cpu_pool_is_shared_by_every_policy_every_round(n_policies: int,
                                                              data: st.DataObject) -> None:
    """`shared`: with fewer units than policies nobody sits a round out; at equal costs each
    policy holds its minimum on one live worker, spread over workers in proportion to their
    units."""
    sizes = data.draw(st.lists(st.integers(min_value=1, max_value=3), min_size=1, max_size=3))
    total = sum(sizes)
    if total >= n_policies:
        sizes, total = [1] * (n_policies - 1), n_policies - 1
    workers = [PoolWorker(f"w{i}", u, cpu_slots=u) for i, u in enumerate(sizes)]
    ids = _ids(n_policies)
    pols = [PolicySpec(p, cost=1.0) for p in ids]
    plan: PoolAssignment | None = None
    for k in range(3):
        plan = plan_round(plan, pols, workers, Settings(short_pool="shared"), k)
        assert plan.strategy == "shared" and plan.active == sorted(ids)
        assert plan.units == dict.fromkeys(ids, 1) and plan.idle_units == 0
        assert all(plan.threads[p] == 1 for p in ids)
        load = {w.worker_id: 0 for w in workers}
        for p in ids:
            (wid, u), = plan.placement[p].items()
            load[wid] += u
        # every worker carries about its share of the policies (within one)
        for w in workers:
            assert abs(load[w.worker_id] - n_policies * w.units / total) <= 1.0
    assert plan is not None and plan.epoch == 1  # a stable pool never moves anything


def test_share_hands_back_to_balanced_when_the_pool_grows() -> None:
    pols = [PolicySpec(p, cost=c) for p, c in (("a", 1.0), ("b", 1.0), ("c", 2.0))]
    small, big = [PoolWorker("w", 2, 2)], [PoolWorker("w", 2, 2), PoolWorker("v", 6, 6)]
    plan = plan_round(None, pols, small, Settings(short_pool="shared"), 0)
    assert plan.strategy == "shared"
    plan = plan_round(plan, pols, big, Settings(short_pool="shared"), 1)
    assert plan.strategy == "balanced" and sum(plan.units.values()) == 8
    assert plan.units["c"] > plan.units["a"]
    # An explicit time-share strategy is never turned into sharing.
    ts = plan_round(None, pols, small, Settings(strategy="time-share", short_pool="shared"), 0)
    assert ts.strategy == "time-share" and len(ts.active) == 2


@settings(max_examples=150, deadline=None)
@given(mins=st.lists(st.integers(min_value=1, max_value=4), min_size=2, max_size=7),
       total=st.integers(min_value=1, max_value=4), data=st.data())
def test_time_share_turns_cover_every_policy_once_per_round(mins: list[int], total: int,
                                                            data: st.DataObject) -> None:
    """Within a round the turns visit every live policy exactly once, each turn within the
    pool; the round is done (a new one may be planned) only after the last turn reported."""
    ids = _ids(len(mins))
    pols = [PolicySpec(p, min_units=m, cost=1.0 + i) for i, (p, m) in enumerate(zip(ids, mins,
                                                                                  strict=True))]
    workers = [PoolWorker("w", total, cpu_slots=total)]
    cursor = data.draw(st.sampled_from([None, *ids]))
    turns, _ = round_turns(ids, dict(zip(ids, mins, strict=True)), total, cursor)
    assert sorted(p for t in turns for p in t) == ids
    plan: PoolAssignment | None = plan_round(None, pols, workers,
                                             Settings(strategy="time-share"), 7)
    assert plan is not None
    reported: dict[str, int] = {}
    seen: list[str] = []
    while plan is not None:
        assert sum(plan.units.values()) == total and plan.round == 7
        assert all(plan.units[p] >= 1 for p in plan.active)
        assert not set(plan.active) & set(seen)
        assert not round_done(plan, reported, ids)
        assert next_turn_plan(plan, pols, workers, reported) is None  # turn still training
        seen += plan.active
        reported.update(dict.fromkeys(plan.active, 7))
        plan = next_turn_plan(plan, pols, workers, reported) or None
        if plan is None:
            break
    assert sorted(seen) == ids


def test_time_share_skips_gone_policies_and_other_plans_are_always_done() -> None:
    ids = ["a", "b", "c"]
    pols = [PolicySpec(p) for p in ids]
    workers = [PoolWorker("w", 1, 1)]
    plan = plan_round(None, pols, workers, Settings(strategy="time-share"), 0)
    assert plan.turns == [["a"], ["b"], ["c"]] and plan.active == ["a"]
    # b left the run: after a's report the pool goes to c; the round is done without b.
    nxt = next_turn_plan(plan, [pols[0], pols[2]], workers, {"a": 0})
    assert nxt is not None and nxt.active == ["c"] and nxt.turn == 2
    assert nxt.epoch == plan.epoch + 1 and nxt.units == {"a": 0, "b": 0, "c": 1}
    assert not round_done(nxt, {"a": 0}, ["a", "c"])
    assert round_done(nxt, {"a": 0, "c": 0}, ["a", "c"])
    assert next_turn_plan(nxt, pols, workers, {"a": 0, "c": 0}) is None  # last turn
    shared = plan_round(None, pols, workers, Settings(short_pool="shared"), 0)
    assert round_done(shared, {}, ids) and next_turn_plan(shared, pols, workers, {}) is None


def test_admit_late_adds_turns_after_the_planned_ones() -> None:
    from mutualrl.mwra.allocation import admit_late

    pool = [PoolWorker("w", 2, cpu_slots=2)]
    ts = Settings(strategy="time-share", turn_policies=1)
    plan = plan_round(None, [PolicySpec("a"), PolicySpec("b")], pool, ts, 3)
    pols = [PolicySpec("a"), PolicySpec("b"), PolicySpec("z"), PolicySpec("c", min_units=2)]
    new = admit_late(plan, pols, pool, ts)
    assert new is not None
    assert new.round == 3 and new.epoch == plan.epoch + 1 and new.turn == plan.turn
    assert new.turns == [["a"], ["b"], ["c"], ["z"]] and new.policies == ["a", "b", "c", "z"]
    assert new.active == plan.active and new.units == {"a": 2, "b": 0, "c": 0, "z": 0}
    assert admit_late(new, pols, pool, ts) is None  # nobody left out
    balanced = plan_round(None, pols[:2], pool, Settings(strategy="balanced"), 0)
    assert admit_late(balanced, pols, pool, Settings(strategy="balanced")) is None
