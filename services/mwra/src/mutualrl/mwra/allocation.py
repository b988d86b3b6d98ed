"""Allocation policies of MWRA: pure math, no network code (tested in microseconds);
docs/design.md (11).

Vocabulary
----------
*Unit*: what the pool is counted in, a CPU thread in local mode and a GPU in cluster mode.
*Pool*: the units of the live workers, N = sum of their units.
*Cost* c_i of policy i: the unit-seconds one round of policy i needs, measured as
``seconds * units`` of each reported step and smoothed with an exponential moving average (EMA,
``ema``). Under the linear-scaling assumption a round of policy i on u_i units takes

    t_i = c_i / u_i            (seconds)

and the round barrier is reached when the slowest policy finishes, at the *makespan*
``T(u) = max_i c_i / u_i``. Units of a policy that finishes early idle until the barrier; the
idle fraction is ``sum_i u_i (T - t_i) / (N T)``.

Policies (``Settings.strategy``)
--------------------------------
``static``     fixed shares by weight: quotas q_i = N w_i / sum_j w_j, rounded by largest
               remainder (``apportion``), every policy at least its minimum m_i.
``balanced``   min-makespan (``balanced_shares``): the continuous optimum gives every policy
               q_i = N c_i / sum_j c_j units, so that all finish together at sum_j c_j / N. The
               integer optimum T* is the least T with ``sum_i max(m_i, ceil(c_i / T)) <= N``
               (``min_makespan``); every policy first gets that many units, and the units left
               over (they cannot lower T*) go by largest remainder of q_i. Hysteresis keeps the
               previous split while ``T(previous) <= (1 + h) T*`` so noise does not thrash it.
``time-share`` when the pool cannot give every policy its minimum (N < sum m_i, e.g. fewer units
               than policies), policies take turns *within* each round: the policy ids in
               sorted order form a ring; from the round's cursor, the ring is cut into turns,
               each the next policies whose minimums fit (at most ``turn_policies`` of them);
               the active turn divides the pool (by cost, as in ``balanced``). When every
               policy of the turn has reported its step of the round, the next turn becomes
               active (``next_turn_plan``); the next round's plan is made only after the last
               turn (``round_done``). So a round costs the sum of its turns, and every policy
               trains every round. The cursor moves by one turn per round, so each policy goes
               first within ceil(P / A) rounds for A policies per turn. ``static`` and
               ``balanced`` fall back to it when the pool is too small and
               ``Settings.short_pool`` is ``time-share``.
``shared``     the other fallback for a pool too small (``short_pool="shared"``, what MWRA uses
               for CPU units): every policy stays active, placed on the workers in proportion
               to their units, so the units are over-committed and the operating system
               time-slices the threads. For CPU threads this is the cheap way to share: the
               trainers' threads on fewer cores take about sum_i c_i / N a round, never more
               than running their steps one after another (what turns cost), and every policy
               sees every peer's experience of the round (under turns, earlier turns cannot see
               later ones'). The threads follow the costs (``shared_shares``): a round cannot
               end before ``C / N`` (C = sum_j c_j, all the work on all N units) nor before the
               slowest policy's own ``c_i / u_i``, so each policy gets

                   u_i = min(W, max(m_i, ceil(N c_i / C)))

               (W: the largest worker's units, since a policy's threads run on one worker):
               the fewest threads with ``c_i / u_i <= C / N``. A slow policy thus takes the
               threads its peers leave idle while they wait for its round, and equal costs
               keep everyone at the minimum. Hysteresis as in ``balanced``, on the makespan
               estimate ``max(C / N, max_i c_i / u_i)`` (``shared_makespan``). A policy whose
               measured round got no faster on more threads keeps the fewest that paid
               (``scaling_cap``), and is planned with the cost its rounds had there: on a
               busy machine a trainer's threads can wait for each other's turns on the
               cores, so more threads make its round slower, and the linear cost model would
               grant it still more.

Rounds: a ``PoolAssignment`` is made for one round and fixed once any policy asked for that round;
``plan_round`` is called only when a policy asks for a later round (between rounds), or, outside
time-share, to take into the current round a live policy the plan was made without (a trainer
that registered late: it gets units at once instead of sitting the round out). A time-share
round takes such a policy in with ``admit_late``: it gets turns after the planned ones, so it
trains in the current round too, and the turns already under way are left as they are. Outside
time-share, a policy that left (its trainer finished and deregistered, or its lease lapsed) is
taken out of the current round the same way, so its units go to the policies still training.

Rollout workers (``rollout_split``)
-----------------------------------
A policy whose trainer can run rollout workers (``PolicySpec.max_rollout_workers`` > 0) and that
holds u >= 2 units splits them between its learner and its rollout workers, which generate the
next round while the learner updates. Its measured rollout and update costs R_i and U_i
(unit-seconds: each phase's seconds times the units it ran on, smoothed like c_i) make the two
finish together when the rollout workers hold

    r_i = u_i R_i / (R_i + U_i)

units (rollout time R_i / r_i = update time U_i / (u_i - r_i) = (R_i + U_i) / u_i); the integer
r_i in [1, u_i - 1] is whichever of floor and ceil has the smaller ``max(R_i / r, U_i / (u_i - r))``
(u_i // 2 before the first measurement); a policy whose units did not change keeps its
previous r_i while that is within the hysteresis of the best (moving a GPU reloads a worker).
On CPU pools (units are threads) the r_i threads go to ``min(max_rollout_workers, r_i)``
workers; on GPU pools each rollout worker holds one device, so ``r_i = min(r_i,
max_rollout_workers)`` workers, and the CPU threads split in the same ratio. A policy on one
unit, or whose trainer runs none, generates in-process (0 workers). The split is part of the
plan, so it moves with the units: a policy that finishes (its units go to
the others at once), a worker whose lease lapsed (the pool shrinks at the next plan) and a
policy that slows (its cost moves the balanced split past the hysteresis) all re-plan it.

Cost of planning: O(P log P + P log N) for P policies and N units (``min_makespan``,
``apportion``); nothing steps through the units one by one, since N is a number clients send.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

Strategy = Literal["static", "balanced", "time-share"]
"""The rule a run configures (`mwra.strategy`)."""
STRATEGIES: tuple[str, ...] = ("static", "balanced", "time-share")
ShortPool = Literal["time-share", "shared"]
"""What `static` and `balanced` fall back to when the pool is short (`mwra.short_pool`)."""
PlanStrategy = Literal["static", "balanced", "time-share", "shared"]
"""The rule that made a plan (`PoolAssignment.strategy`, `Allocation.strategy` on the wire):
a `Strategy`, or `shared` when a short pool was shared."""


@dataclass(frozen=True)
class PolicySpec:
    """A live policy as the allocator sees it."""

    policy_id: str
    min_units: int = 1
    """Fewest units the policy may get when it is active (>= 1)."""
    weight: float = 1.0
    """Share weight of `static` (> 0)."""
    rollout_budget: int = 0
    """Samples per active round, handed back in the allocation."""
    cost: float | None = None
    """Smoothed unit-seconds per round; None until the policy reported a step."""
    max_rollout_workers: int = 0
    """Rollout workers the policy's trainer can run (0: rollouts in-process only)."""
    rollout_cost: float | None = None
    """Smoothed unit-seconds of a round's rollouts (seconds times the units they ran on)."""
    update_cost: float | None = None
    """Smoothed unit-seconds of a round's update (seconds times the learner's units)."""
    seconds_by_units: Mapping[int, float] = field(default_factory=dict)
    """Smoothed seconds per round at each unit count the policy ran on (`scaling_cap`)."""


@dataclass(frozen=True)
class PoolWorker:
    """A live worker: `units` of the pool (CPU slots or GPUs), its CPU slots and rollout server."""

    worker_id: str
    units: int
    cpu_slots: int = 0
    rollout_address: str = ""


@dataclass(frozen=True)
class Settings:
    """How plans are made (mirrors the allocation fields of `MwraConfig`)."""

    strategy: Strategy = "balanced"
    hysteresis: float = 0.1
    """`balanced` keeps the previous split unless the optimum is this much (relative) faster."""
    turn_policies: int | None = None
    """`time-share`: most policies active in one round (None: as many as fit)."""
    short_pool: ShortPool = "time-share"
    """What `static` / `balanced` do when the pool cannot give every policy its minimum:
    take turns (`time-share`, for exclusive units such as GPUs) or over-commit the units
    (`shared`, for CPU threads; see `shared_placement`)."""
    unit: Literal["cpu", "gpu"] = "cpu"
    """What the pool counts: CPU threads, or GPUs (a rollout worker then holds one device)."""


@dataclass
class PoolAssignment:
    """The allocation of a run for one round: who holds which units of which worker."""

    round: int
    epoch: int
    strategy: str
    """The rule that produced it (a `PlanStrategy`: `static`, `balanced`, `time-share` or
    `shared`, after any fallback)."""
    units: dict[str, int]
    """Units per policy of the plan (0 for a policy that sits the round out)."""
    placement: dict[str, dict[str, int]]
    """policy -> worker -> units taken from that worker."""
    active: list[str]
    pool_units: int
    workers: list[str]
    """Live workers the plan was made over (sorted)."""
    policies: list[str]
    """Live policies the plan was made for (sorted)."""
    next_turn: str | None = None
    """time-share cursor: the first policy in line next round."""
    costs: dict[str, float] = field(default_factory=dict)
    """Costs the plan was computed with (unit-seconds per round)."""
    threads: dict[str, int] = field(default_factory=dict)
    """CPU threads per policy: on each worker, its share of the worker's CPU slots
    (``floor(cpu_slots * units_taken / worker_units)``, at least 1 per policy holding units;
    equal to the units in CPU mode; 0 for a policy that sits the round out)."""
    rollout: dict[str, str] = field(default_factory=dict)
    """Rollout server address of each placed worker that has one."""
    turns: list[list[str]] = field(default_factory=list)
    """time-share: the round's turns in order (every live policy in exactly one)."""
    turn: int = 0
    """time-share: index of the active turn in `turns`."""
    rollout_units: dict[str, int] = field(default_factory=dict)
    """Units of each policy's that its rollout workers hold (`rollout_split`; 0: in-process)."""
    rollout_workers: dict[str, int] = field(default_factory=dict)
    """Rollout workers each policy runs this round (0: rollouts in-process)."""
    rollout_threads: dict[str, int] = field(default_factory=dict)
    """Of each policy's threads, those its rollout workers use (the learner keeps the rest)."""

    @property
    def idle_units(self) -> int:
        return max(self.pool_units - sum(self.units.values()), 0)

    @property
    def empty(self) -> bool:
        """Nobody holds anything: such a plan may be replaced within its round (startup)."""
        return sum(self.units.values()) == 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> PoolAssignment:
        return cls(**json.loads(text))


def ema(previous: float | None, observed: float, alpha: float) -> float:
    """Exponential moving average: ``alpha * observed + (1 - alpha) * previous``.

    The first observation is taken as it is; alpha in (0, 1] is the weight of the newest.
    """
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    if previous is None:
        return observed
    return alpha * observed + (1.0 - alpha) * previous


def makespan(costs: Mapping[str, float], units: Mapping[str, int]) -> float:
    """``max_i c_i / u_i`` over the policies holding units (inf when one holds none)."""
    worst = 0.0
    for pid, cost in costs.items():
        u = units.get(pid, 0)
        if u <= 0:
            return math.inf
        worst = max(worst, cost / u)
    return worst


def idle_fraction(costs: Mapping[str, float], units: Mapping[str, int]) -> float:
    """Share of the unit-time of a round spent waiting at the barrier:
    ``sum_i u_i (T - c_i/u_i) / (N T)`` with T the makespan and N the units held."""
    total = sum(units[p] for p in costs)
    span = makespan(costs, units)
    if total == 0 or span in (0.0, math.inf):
        return 0.0
    busy = sum(costs.values())  # sum_i u_i * (c_i / u_i)
    return (total * span - busy) / (total * span)


def _clamped_minimums(minimums: Mapping[str, int], total: int) -> dict[str, int]:
    # A policy may ask for more than the whole pool; on its turn it gets the pool.
    return {p: max(1, min(int(m), total)) for p, m in minimums.items()}


def apportion(quotas: Mapping[str, float], total: int, minimums: Mapping[str, int],
              base: Mapping[str, int] | None = None,
              tiebreak: Mapping[str, float] | None = None) -> dict[str, int]:
    """Integer shares summing to `total`, each >= its minimum, close to `quotas`.

    Largest-remainder (Hamilton) rounding: start from ``max(m_i, floor(q_i))`` (or `base`),
    then hand out missing units one at a time to the largest deficit ``q_i - u_i`` and, when the
    minimums overshoot, take units back from the largest surplus ``u_i - q_i`` among those above
    their minimum. Ties go to the larger `tiebreak` value, then to the smaller policy id, so the
    result is deterministic. Requires ``sum(minimums) <= total``.

    The unit-at-a-time rule is evaluated in O(P log P + P log N) (`_first_picks`), never
    in steps proportional to the units moved: a pool's size is a number clients send.
    """
    if sum(minimums.values()) > total:
        raise ValueError("minimums exceed the pool; time-share instead")
    tb = tiebreak or {}
    shares = {p: max(int(minimums[p]), math.floor(q)) for p, q in quotas.items()}
    if base is not None:
        shares = {p: max(int(minimums[p]), int(base[p])) for p in quotas}
    missing = total - sum(shares.values())
    if missing > 0:
        return _give(shares, quotas, missing, tb)
    if missing < 0:
        return _take_back(shares, quotas, -missing, minimums, tb)
    return shares


def _give(shares: dict[str, int], quotas: Mapping[str, float], count: int,
          tb: Mapping[str, float]) -> dict[str, int]:
    """Hand out `count` units one at a time to the largest deficit ``q_i - u_i`` (ties: larger
    tiebreak, then smaller id)."""
    picks = _first_picks(count, {p: count for p in shares},
                         lambda p, t: (shares[p] + t) - quotas[p],
                         lambda p: (-tb.get(p, 0.0), p))
    return {p: shares[p] + picks[p] for p in shares}


def _take_back(shares: dict[str, int], quotas: Mapping[str, float], count: int,
               minimums: Mapping[str, int], tb: Mapping[str, float]) -> dict[str, int]:
    """Take back `count` units one at a time from the largest surplus ``u_i - q_i`` among the
    policies above their minimum (ties: smaller tiebreak, then smaller id)."""
    picks = _first_picks(count, {p: max(shares[p] - int(minimums[p]), 0) for p in shares},
                         lambda p, t: quotas[p] - (shares[p] - t),
                         lambda p: (tb.get(p, 0.0), p))
    return {p: shares[p] - picks[p] for p in shares}


def _first_picks(count: int, limits: Mapping[str, int], key: Callable[[str, int], float],
                 order: Callable[[str], tuple[float, str]]) -> dict[str, int]:
    """How many of the first `count` picks of a unit-at-a-time rule go to each policy.

    The rule picks, each step, the policy whose next unit has the least ``(key(p, t),
    order(p))``, t being the units it already got (at most ``limits[p]``); ``key(p, t)`` grows
    by one per unit. So the picks are the `count` least entries of the policies' merged
    sequences, found without stepping through them: a binary search for the last integer level
    L with at most `count` keys below it (each policy's count below L is its offset to L,
    corrected against the exact float keys), then the few picks left, all at keys in
    [L, L + 1), from a heap. Exactly the rule's result, in O(P log N + P log P)."""
    start = {p: key(p, 0) for p in limits if limits[p] > 0}

    def below(p: str, level: int) -> int:
        t = min(max(math.ceil(level - start[p]), 0), limits[p])
        while t > 0 and key(p, t - 1) >= level:
            t -= 1
        while t < limits[p] and key(p, t) < level:
            t += 1
        return t

    def below_all(level: int) -> int:
        return sum(below(p, level) for p in start)

    picks = dict.fromkeys(limits, 0)
    if count <= 0 or not start:
        return picks
    lo = math.floor(min(start.values()))  # no key lies below it
    hi = math.ceil(max(start.values())) + count + 1  # every policy's first count + 1 keys do
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if below_all(mid) <= count else (lo, mid)
    for p in start:
        picks[p] = below(p, lo)
    heap = [(key(p, picks[p]), order(p), p) for p in start if picks[p] < limits[p]]
    heapq.heapify(heap)
    for _ in range(count - sum(picks.values())):
        _, rank, p = heapq.heappop(heap)
        picks[p] += 1
        if picks[p] < limits[p]:
            heapq.heappush(heap, (key(p, picks[p]), rank, p))
    return picks


def static_shares(weights: Mapping[str, float], total: int,
                  minimums: Mapping[str, int]) -> dict[str, int]:
    """`static`: quotas ``N w_i / sum w``, largest-remainder rounding, minimums respected."""
    wsum = sum(weights.values())
    quotas = {p: total * w / wsum for p, w in weights.items()}
    return apportion(quotas, total, minimums, tiebreak=weights)


def min_makespan(costs: Mapping[str, float], total: int, minimums: Mapping[str, int]) -> float:
    """The least achievable makespan T* with integer units (exact).

    Giving policy i ``need_i(T) = max(m_i, ceil(c_i / T))`` units is the cheapest way to finish
    by T, so T is feasible iff ``G(T) = sum_i need_i(T) <= N``. G only changes at the values
    c_i / k (k >= m_i), so T* is the least feasible one of them. They are not scanned one by
    one (there are up to P N of them, and N is a number clients send): the continuous
    relaxation ``S(T) = sum_i max(m_i, c_i / T)`` satisfies ``S <= G <= S + P``, so T* lies
    between the T where S = N and the T where S = N - P, a window holding at most about 2P
    of the values; they are sorted and searched for the least feasible one. O(P log P).
    """
    if sum(minimums.values()) > total:
        raise ValueError("minimums exceed the pool")
    live = {p: float(c) for p, c in costs.items() if c > 0}
    if not live:
        return 0.0  # every cost is zero: any split finishes at once
    mins = {p: max(1, int(minimums[p])) for p in live}
    # policies that cost nothing hold their minimums whatever T is
    units = total - sum(int(minimums[p]) for p in costs if p not in live)
    at_minimums = max(live[p] / mins[p] for p in live)  # G = sum(m) <= N: always feasible
    lo = _relaxed_makespan(live, mins, units)
    hi = (_relaxed_makespan(live, mins, units - len(live))
          if units - len(live) >= sum(mins.values()) else at_minimums)
    lo, hi = lo * (1 - _WINDOW_SLACK), min(hi * (1 + _WINDOW_SLACK), at_minimums)
    candidates: set[float] = {at_minimums}
    for p, c in live.items():
        first = max(mins[p], math.floor(c / hi))
        last = min(total, math.ceil(c / lo)) if lo > 0 else total
        candidates.update(c / k for k in range(first, last + 1))
    ordered = sorted(t for t in candidates if t > 0)

    def feasible(t: float) -> bool:
        return sum(_need(costs[p], t, minimums[p]) for p in costs) <= total

    lo_i, hi_i = 0, len(ordered) - 1  # ordered[-1] >= at_minimums is feasible
    while lo_i < hi_i:
        mid = (lo_i + hi_i) // 2
        lo_i, hi_i = (lo_i, mid) if feasible(ordered[mid]) else (mid + 1, hi_i)
    return ordered[lo_i]


# Relative widening of the relaxation's window: covers the rounding of its float arithmetic and
# the 1e-12 tolerance of `_need`.
_WINDOW_SLACK = 1e-11


def _relaxed_makespan(costs: Mapping[str, float], mins: Mapping[str, int], units: int) -> float:
    """The least T with ``sum_i max(m_i, c_i / T) <= units`` (requires sum m_i <= units).

    Policies leave their minimum in decreasing order of c_i / m_i; with the first j of them
    above it, S(T) = C_j / T + M_rest and S(T) = units gives T = C_j / (units - M_rest),
    valid when it lies between the j-th and (j+1)-th breakpoint. O(P log P)."""
    order = sorted(costs, key=lambda p: costs[p] / mins[p], reverse=True)
    above, rest = 0.0, sum(mins.values())
    for j, p in enumerate(order):
        above += costs[p]
        rest -= mins[p]
        t = above / (units - rest)  # units - rest >= the minimums of the first j + 1 > 0
        after = costs[order[j + 1]] / mins[order[j + 1]] if j + 1 < len(order) else 0.0
        if t >= after:
            return t
    return sum(costs.values()) / units


MIN_COST = 1e-9
"""Unit-seconds a cost of zero or less is planned with."""
MAX_COST = 1e15
"""Largest cost planned with: keeps every ratio of costs, and c / T, finite."""


def _safe_cost(cost: float | None) -> float:
    c = float(cost) if cost is not None else math.nan
    if math.isnan(c) or c <= 0:
        return MIN_COST
    return min(c, MAX_COST)


def _need(cost: float, t: float, minimum: int) -> int:
    # A relative tolerance keeps c/(c/k) from rounding up to k + 1 in floating point.
    return max(minimum, math.ceil(cost / t * (1 - 1e-12)))


def balanced_shares(costs: Mapping[str, float], total: int,
                    minimums: Mapping[str, int]) -> dict[str, int]:
    """`balanced`: a min-makespan split, as close to proportional ``N c_i / sum c`` as possible.

    Every policy gets ``need_i(T*)`` (see `min_makespan`), which reaches the optimum; the units
    left over go by largest remainder of the proportional quotas (more units never raise a
    finish time). Costs of zero or less (or NaN) are treated as a tiny positive cost, costs
    above `MAX_COST` (or infinite) as `MAX_COST`.
    """
    safe = {p: _safe_cost(c) for p, c in costs.items()}
    csum = sum(safe.values())
    quotas = {p: total * c / csum for p, c in safe.items()}
    t_star = min_makespan(safe, total, minimums)
    base = {p: _need(safe[p], t_star, minimums[p]) if t_star > 0 else minimums[p] for p in safe}
    return apportion(quotas, total, minimums, base=base, tiebreak=safe)


def shared_shares(costs: Mapping[str, float], total: int, minimums: Mapping[str, int],
                  largest: int, caps: Mapping[str, int] | None = None) -> dict[str, int]:
    """`shared`: ``u_i = min(W, max(m_i, ceil(N c_i / C)))``, the fewest threads with which
    policy i's own round ``c_i / u_i`` fits in the pooled round ``C / N`` (N = `total`, W =
    `largest`, the most units one worker has), and at most `caps` (`scaling_cap`) unless the
    minimum asks for more. Costs are made safe as in `balanced_shares`."""
    safe = {p: _safe_cost(c) for p, c in costs.items()}
    pooled = sum(safe.values()) / total
    cap = caps or {}
    return {p: max(1, int(minimums[p]),
                   min(largest, cap.get(p, largest), _need(c, pooled, int(minimums[p]))))
            for p, c in safe.items()}


def scaling_cap(seconds_by_units: Mapping[int, float]) -> int | None:
    """The fewest units past which the policy's measured rounds got no faster: the least
    measured count u with a larger measured count whose round took at least as long; None
    while every step up paid. Over-committed CPU threads can make a trainer slower on more
    threads (its threads wait for each other's turns on a busy core), which the linear model
    of the cost cannot see: the cost then grows with the units, and the rule would grant
    even more."""
    measured = sorted(seconds_by_units.items())
    for i, (units, seconds) in enumerate(measured):
        if any(later >= seconds for _, later in measured[i + 1:]):
            return units
    return None


def shared_makespan(costs: Mapping[str, float], units: Mapping[str, int], total: int) -> float:
    """Estimated round of an over-committed pool: ``max(C / N, max_i c_i / u_i)`` (inf when a
    policy holds no unit)."""
    return max(sum(costs.values()) / total, makespan(costs, units))


def rollout_split(units: int, rollout_cost: float | None, update_cost: float | None,
                  max_workers: int, devices: bool, previous: int = 0,
                  hysteresis: float = 0.0) -> tuple[int, int]:
    """(units of the policy's rollout workers, rollout workers) for a policy on `units` units.

    ``r = u R / (R + U)`` rounded to whichever neighbour has the smaller ``max(R / r,
    U / (u - r))``, within [1, u - 1]; u // 2 before both costs are measured. On GPUs
    (`devices`) each worker holds one device: r and the workers are at most `max_workers`.
    (0, 0) when the trainer runs no worker or the policy holds fewer than 2 units. The
    `previous` split of these units stays while its ``max(R / r, U / (u - r))`` is within
    (1 + `hysteresis`) of the best one's: moving a device reloads a worker's weights."""
    if max_workers <= 0 or units < 2:
        return 0, 0
    if rollout_cost is None or update_cost is None or rollout_cost <= 0 or update_cost <= 0:
        r = units // 2
    else:
        rc, uc = _safe_cost(rollout_cost), _safe_cost(update_cost)

        def span(k: int) -> float:
            return max(rc / k, uc / (units - k))

        exact = units * rc / (rc + uc)
        lo, hi = max(1, math.floor(exact)), min(units - 1, max(1, math.ceil(exact)))
        r = min((lo, hi), key=lambda k: (span(k), k))
        if 1 <= previous < units and span(previous) <= (1.0 + hysteresis) * span(r):
            r = previous
    r = min(max(r, 1), units - 1)
    if devices:
        r = min(r, max_workers)
    return r, min(max_workers, r)


def _with_rollouts(plan: PoolAssignment, policies: Sequence[PolicySpec],
                   settings: Settings, previous: PoolAssignment | None) -> PoolAssignment:
    """The plan with each policy's rollout workers (`rollout_split`, keeping the `previous`
    plan's split of the same units within the hysteresis) and their threads: the policy's
    threads in the ratio of its rollout units to its units, at least one each for the learner
    and the workers."""
    by_id = {p.policy_id: p for p in policies}
    before = previous if previous is not None else PoolAssignment(
        round=-1, epoch=0, strategy="", units={}, placement={}, active=[], pool_units=0,
        workers=[], policies=[])
    plan.rollout_units, plan.rollout_workers, plan.rollout_threads = {}, {}, {}
    for pid in plan.policies:
        spec, units = by_id.get(pid), plan.units.get(pid, 0)
        kept = before.rollout_units.get(pid, 0) if before.units.get(pid) == units else 0
        r, n = (rollout_split(units, spec.rollout_cost, spec.update_cost,
                              spec.max_rollout_workers, settings.unit == "gpu", kept,
                              settings.hysteresis)
                if spec is not None and pid in plan.active else (0, 0))
        threads = plan.threads.get(pid, 0)
        plan.rollout_units[pid], plan.rollout_workers[pid] = r, n
        plan.rollout_threads[pid] = (min(max(threads * r // units, 1), threads - 1)
                                     if r and threads >= 2 else 0)
    return plan


def turn(policies: Sequence[str], minimums: Mapping[str, int], total: int,
         cursor: str | None, max_active: int | None = None) -> tuple[list[str], str | None]:
    """One round of the time-share ring: the active policies and the next cursor.

    `policies` sorted; the turn starts at the first policy id >= `cursor` (wrapping), takes
    policies while their (clamped) minimums fit into `total` and at most `max_active` of them
    (always at least one), and the next cursor is the policy after the last one taken.
    """
    if not policies:
        return [], cursor
    ring = sorted(policies)
    start = 0 if cursor is None else bisect.bisect_left(ring, cursor) % len(ring)
    mins = _clamped_minimums(minimums, total)
    active: list[str] = []
    used = 0
    for step in range(len(ring)):
        pid = ring[(start + step) % len(ring)]
        if active and (used + mins[pid] > total or (max_active and len(active) >= max_active)):
            break
        active.append(pid)
        used += mins[pid]
    nxt = ring[(start + len(active)) % len(ring)]
    return sorted(active), nxt


def round_turns(policies: Sequence[str], minimums: Mapping[str, int], total: int,
                cursor: str | None, max_active: int | None = None
                ) -> tuple[list[list[str]], str | None]:
    """A round of the time-share ring cut into turns (every policy in exactly one), starting
    at `cursor`; the next round's cursor is where the round's second turn starts, so the first
    turn rotates by one turn per round."""
    ring = sorted(policies)
    turns: list[list[str]] = []
    left, at, nxt = list(ring), cursor, None
    while left:
        active, after = turn(left, minimums, total, at, max_active)
        turns.append(active)
        nxt = after if nxt is None else nxt
        taken = set(active)
        # The cursor is the first id after the turn on the full ring that is still waiting.
        left = [p for p in left if p not in taken]
        at = after
    return turns, nxt


def round_done(plan: PoolAssignment, reported: Mapping[str, int], live: Sequence[str]) -> bool:
    """Has every live policy of the plan's round trained it (reported a step of that round)?
    Only time-share holds a new round back: other plans are always done."""
    if plan.strategy != "time-share" or not plan.turns:
        return True
    return all(reported.get(p, -1) >= plan.round for t in plan.turns for p in t if p in live)


def next_turn_plan(plan: PoolAssignment, policies: Sequence[PolicySpec],
                   workers: Sequence[PoolWorker], reported: Mapping[str, int],
                   settings: Settings | None = None) -> PoolAssignment | None:
    """time-share: once every live policy of the active turn has reported `plan.round`, the plan
    of the round's next turn with live policies (same round, next epoch); None otherwise."""
    if plan.strategy != "time-share" or not plan.turns:
        return None
    live = {p.policy_id for p in policies}
    if any(reported.get(p, -1) < plan.round for p in plan.active if p in live):
        return None
    idx = plan.turn + 1
    while idx < len(plan.turns) and not any(p in live for p in plan.turns[idx]):
        idx += 1
    pool = [w for w in sorted(workers, key=lambda w: w.worker_id) if w.units > 0]
    total = sum(w.units for w in pool)
    if idx >= len(plan.turns) or total == 0:
        return None
    pols = sorted((p for p in policies if p.policy_id in plan.turns[idx]),
                  key=lambda p: p.policy_id)
    costs = effective_costs(sorted(policies, key=lambda p: p.policy_id))
    mins = _clamped_minimums({p.policy_id: p.min_units for p in pols}, total)
    active = [p.policy_id for p in pols]
    shares = balanced_shares({p: costs[p] for p in active}, total, mins)
    units = {p: shares.get(p, 0) for p in plan.policies}
    placement = place(units, pool, plan.placement)
    nxt = PoolAssignment(round=plan.round, epoch=plan.epoch, strategy=plan.strategy, units=units,
               placement=placement, active=sorted(active), pool_units=total,
               workers=[w.worker_id for w in pool], policies=plan.policies,
               next_turn=plan.next_turn, costs=costs, threads=_threads(placement, pool),
               rollout={w.worker_id: w.rollout_address for w in pool if w.rollout_address
                        and any(w.worker_id in ws for ws in placement.values())},
               turns=plan.turns, turn=idx)
    return _bump(plan, _with_rollouts(nxt, policies, settings or Settings(), plan))


def admit_late(plan: PoolAssignment, policies: Sequence[PolicySpec],
               workers: Sequence[PoolWorker], settings: Settings) -> PoolAssignment | None:
    """time-share: the round's plan with the live policies it was made without (registered
    late) as turns after the planned ones: same round, the active turn unchanged, a new epoch.
    None when no policy is left out (or the plan is not a time-share one)."""
    if plan.strategy != "time-share" or not plan.turns:
        return None
    late = sorted(p.policy_id for p in policies if p.policy_id not in plan.policies)
    total = sum(w.units for w in workers if w.units > 0)
    if not late:
        return None
    mins = _clamped_minimums({p.policy_id: p.min_units for p in policies
                              if p.policy_id in late}, total)
    max_active = settings.turn_policies if settings.strategy == "time-share" else None
    extra, _ = round_turns(late, mins, total, None, max_active)
    costs = effective_costs(sorted(policies, key=lambda p: p.policy_id))
    new = dataclasses.replace(
        plan, policies=sorted([*plan.policies, *late]), turns=[*plan.turns, *extra],
        units={**plan.units, **{p: 0 for p in late}},
        placement={**plan.placement, **{p: {} for p in late}},
        threads={**plan.threads, **{p: 0 for p in late}},
        costs={**plan.costs, **{p: costs[p] for p in late}})
    return _bump(plan, _with_rollouts(new, policies, settings, plan))


def place(units: Mapping[str, int], workers: Sequence[PoolWorker],
          previous: Mapping[str, Mapping[str, int]] | None = None) -> dict[str, dict[str, int]]:
    """Map unit counts onto workers, keeping what each policy held before where possible.

    Moving a unit costs (a rollout server reloads weights, threads migrate), so each policy first
    keeps its previous units on workers still live, then fills up from free units in worker-id
    order. Deterministic: policies and workers are visited in sorted order.
    """
    free = {w.worker_id: w.units for w in sorted(workers, key=lambda w: w.worker_id)}
    need = dict(units)
    placement: dict[str, dict[str, int]] = {p: {} for p in sorted(units)}
    for pid in sorted(units):
        for wid, held in sorted((previous or {}).get(pid, {}).items()):
            take = min(held, free.get(wid, 0), need[pid])
            if take > 0:
                placement[pid][wid] = take
                free[wid] -= take
                need[pid] -= take
    for pid in sorted(units):
        for wid in free:
            if need[pid] == 0:
                break
            take = min(free[wid], need[pid])
            if take > 0:
                placement[pid][wid] = placement[pid].get(wid, 0) + take
                free[wid] -= take
                need[pid] -= take
        if need[pid]:
            raise ValueError(f"pool too small to place {units[pid]} units for {pid}")
    return {p: dict(sorted(ws.items())) for p, ws in placement.items()}


def shared_placement(units: Mapping[str, int],
                     workers: Sequence[PoolWorker]) -> dict[str, dict[str, int]]:
    """`shared`: every policy's units on one worker each, workers filled in proportion to
    their units (policy j of P, in id order, goes to the worker covering position
    (j + 1/2) N / P of the pool's N units), so over-commitment is spread evenly."""
    ids = sorted(units)
    pool = sorted(workers, key=lambda w: w.worker_id)
    total = sum(w.units for w in pool)
    bounds = list(itertools.accumulate(w.units for w in pool))
    placement: dict[str, dict[str, int]] = {}
    for j, pid in enumerate(ids):
        pos = (j + 0.5) * total / len(ids)
        w = pool[min(bisect.bisect_right(bounds, pos), len(pool) - 1)]
        placement[pid] = {w.worker_id: min(units[pid], w.units)}
    return placement


def effective_costs(policies: Sequence[PolicySpec]) -> dict[str, float]:
    """Costs to plan with: measured ones, and for policies that never reported the mean of the
    measured ones (all equal when nobody reported yet, so `balanced` starts as an equal split)."""
    known = [_safe_cost(p.cost) for p in policies if p.cost is not None and p.cost > 0]
    fallback = sum(known) / len(known) if known else 1.0
    return {p.policy_id: (_safe_cost(p.cost) if p.cost is not None and p.cost > 0 else fallback)
            for p in policies}


def plan_round(previous: PoolAssignment | None, policies: Sequence[PolicySpec],
               workers: Sequence[PoolWorker], settings: Settings, round_: int) -> PoolAssignment:
    """The plan for `round_` given the live policies, the live workers and the previous plan.

    The epoch moves on only when who-holds-what changes; the round always becomes `round_`.
    """
    pols = sorted(policies, key=lambda p: p.policy_id)
    pool = [w for w in sorted(workers, key=lambda w: w.worker_id) if w.units > 0]
    total = sum(w.units for w in pool)
    ids = [p.policy_id for p in pols]
    costs = effective_costs(pols)
    prev_epoch = previous.epoch if previous else 0
    cursor = previous.next_turn if previous else None
    if total == 0 or not pols:
        plan = PoolAssignment(round=round_, epoch=prev_epoch, strategy=settings.strategy,
                    units={p: 0 for p in ids}, placement={p: {} for p in ids}, active=[],
                    pool_units=total, workers=[w.worker_id for w in pool], policies=ids,
                    next_turn=cursor, costs=costs)
        return _bump(previous, plan)
    mins = _clamped_minimums({p.policy_id: p.min_units for p in pols}, total)
    strategy: str = settings.strategy
    if (strategy != "time-share" and sum(mins.values()) > total
            and settings.short_pool == "shared"):
        largest = max(w.units for w in pool)
        caps = {p.policy_id: c for p in pols
                if (c := scaling_cap(p.seconds_by_units)) is not None}
        # a capped policy costs what its rounds took on the capped units
        at_cap = {**costs, **{p.policy_id: p.seconds_by_units[caps[p.policy_id]]
                              * caps[p.policy_id] for p in pols if p.policy_id in caps}}
        units = shared_shares(at_cap, total, mins, largest, caps)
        kept = _kept_shared(previous, ids, at_cap, mins, total, largest, caps, settings)
        units = kept if kept is not None else units
        placement = shared_placement(units, pool)
        units = {p: sum(placement[p].values()) for p in ids}
        plan = PoolAssignment(round=round_, epoch=prev_epoch, strategy="shared", units=units,
                    placement=placement, active=list(ids), pool_units=total,
                    workers=[w.worker_id for w in pool], policies=ids, next_turn=cursor,
                    costs=costs, threads=_threads(placement, pool),
                    rollout={w.worker_id: w.rollout_address for w in pool if w.rollout_address
                             and any(w.worker_id in ws for ws in placement.values())})
        return _bump(previous, _with_rollouts(plan, pols, settings, previous))
    turns: list[list[str]] = []
    if strategy == "time-share" or sum(mins.values()) > total:
        strategy = "time-share"
        max_active = settings.turn_policies if settings.strategy == "time-share" else None
        turns, cursor = round_turns(ids, mins, total, cursor, max_active)
        active = turns[0]
    else:
        active = ids
    act_costs = {p: costs[p] for p in active}
    act_mins = {p: mins[p] for p in active}
    if strategy == "static":
        shares = static_shares({p.policy_id: p.weight for p in pols}, total, mins)
    else:
        shares = balanced_shares(act_costs, total, act_mins)
        kept = _kept_by_hysteresis(previous, active, act_costs, act_mins, total, settings)
        if kept is not None and strategy == (previous.strategy if previous else None):
            shares = kept
    units = {p: shares.get(p, 0) for p in ids}
    placement = place(units, pool, previous.placement if previous else None)
    plan = PoolAssignment(round=round_, epoch=prev_epoch, strategy=strategy, units=units,
                placement=placement, active=sorted(active), pool_units=total,
                workers=[w.worker_id for w in pool], policies=ids, next_turn=cursor, costs=costs,
                threads=_threads(placement, pool),
                rollout={w.worker_id: w.rollout_address for w in pool if w.rollout_address
                         and any(w.worker_id in ws for ws in placement.values())},
                turns=turns)
    return _bump(previous, _with_rollouts(plan, pols, settings, previous))


def _threads(placement: Mapping[str, Mapping[str, int]],
             pool: Sequence[PoolWorker]) -> dict[str, int]:
    by_id = {w.worker_id: w for w in pool}
    threads: dict[str, int] = {}
    for pid, slices in placement.items():
        n = sum(by_id[wid].cpu_slots * u // by_id[wid].units for wid, u in slices.items())
        threads[pid] = max(1, n) if slices else 0
    return threads


def _kept_by_hysteresis(previous: PoolAssignment | None, active: Sequence[str],
                        costs: Mapping[str, float], mins: Mapping[str, int], total: int,
                        settings: Settings) -> dict[str, int] | None:
    """The previous split when it is still valid and within (1 + h) of the optimal makespan."""
    if previous is None or sorted(previous.active) != sorted(active):
        return None
    old = {p: previous.units.get(p, 0) for p in active}
    if sum(old.values()) != total or any(old[p] < mins[p] for p in active):
        return None  # pool or minimums changed: the old split no longer fits
    best = makespan(costs, balanced_shares(costs, total, mins))
    if makespan(costs, old) <= (1.0 + settings.hysteresis) * best:
        return old
    return None


def _kept_shared(previous: PoolAssignment | None, ids: Sequence[str],
                 costs: Mapping[str, float], mins: Mapping[str, int], total: int,
                 largest: int, caps: Mapping[str, int],
                 settings: Settings) -> dict[str, int] | None:
    """`shared`: the previous shares when they were shared among the same policies, still
    meet the minimums and the caps, and their `shared_makespan` is within (1 + h) of the new
    shares'."""
    if (previous is None or previous.strategy != "shared"
            or sorted(previous.policies) != sorted(ids)):
        return None
    old = {p: previous.units.get(p, 0) for p in ids}
    if any(old[p] < mins[p] or old[p] > max(caps.get(p, old[p]), mins[p]) for p in ids):
        return None
    safe = {p: _safe_cost(c) for p, c in costs.items()}
    new = shared_shares(costs, total, mins, largest, caps)
    if shared_makespan(safe, old, total) <= (1.0 + settings.hysteresis) * shared_makespan(
            safe, new, total):
        return old
    return None


def _bump(previous: PoolAssignment | None, plan: PoolAssignment) -> PoolAssignment:
    if previous is None:
        plan.epoch = 1
    elif (previous.placement != plan.placement or previous.active != plan.active
          or previous.units != plan.units or previous.rollout_units != plan.rollout_units
          or previous.rollout_workers != plan.rollout_workers):
        plan.epoch = previous.epoch + 1
    return plan
