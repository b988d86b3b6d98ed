"""Simulated rounds of a run under an allocation policy (pure, seeded, deterministic).

Each policy i has a true cost c_i (unit-seconds per round). In round k the allocator's plan gives
it u_i units; the round takes ``c_i * noise / u_i`` seconds (noise lognormal, median 1); the
makespan is the slowest policy's time; the measured ``seconds * units`` feeds the EMA exactly as
`ReportStepCost` does in the service. Used by the simulation test and `mutualrl bench mwra`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mutualrl.mwra.allocation import (
    PolicySpec,
    PoolAssignment,
    PoolWorker,
    Settings,
    Strategy,
    ema,
    plan_round,
)


@dataclass(frozen=True)
class SimResult:
    strategy: str
    rounds: int
    total_makespan: float
    """Sum over rounds of the round makespan (seconds): the run's wall-clock time."""
    idle_fraction: float
    """Unit-seconds spent waiting at the barrier / unit-seconds available."""
    rebalances: int
    """Epoch changes after the first plan."""
    last_units: dict[str, int]


def simulate(costs: Mapping[str, float], units: int, strategy: Strategy, *, rounds: int = 50,
             noise: float = 0.0, seed: int = 0, smoothing: float = 0.3, hysteresis: float = 0.1,
             turn_policies: int | None = None) -> SimResult:
    """Run `rounds` rounds on a single worker of `units` units; returns totals."""
    rng = random.Random(seed)
    settings = Settings(strategy=strategy, hysteresis=hysteresis, turn_policies=turn_policies)
    workers = [PoolWorker("sim-0", units, cpu_slots=units)]
    smoothed: dict[str, float | None] = dict.fromkeys(costs)
    plan: PoolAssignment | None = None
    total_span = 0.0
    busy = 0.0
    available = 0.0
    first_epoch = None
    for k in range(rounds):
        pols = [PolicySpec(p, cost=smoothed[p]) for p in sorted(costs)]
        plan = plan_round(plan, pols, workers, settings, k)
        first_epoch = plan.epoch if first_epoch is None else first_epoch
        times: dict[str, float] = {}
        for pid in plan.active:
            u = plan.units[pid]
            factor = rng.lognormvariate(0.0, noise) if noise > 0 else 1.0
            times[pid] = costs[pid] * factor / u
        span = max(times.values())
        total_span += span
        available += units * span
        busy += sum(plan.units[p] * t for p, t in times.items())
        for pid, t in times.items():
            smoothed[pid] = ema(smoothed[pid], t * plan.units[pid], smoothing)
    assert plan is not None and first_epoch is not None
    return SimResult(strategy=strategy, rounds=rounds, total_makespan=total_span,
                     idle_fraction=(available - busy) / available if available else 0.0,
                     rebalances=plan.epoch - first_epoch, last_units=dict(plan.units))


def compare(costs: Mapping[str, float], units: int, *, rounds: int = 50, noise: float = 0.1,
            seed: int = 0, smoothing: float = 0.3, hysteresis: float = 0.1) -> dict[str, Any]:
    """`balanced` against `static` equal shares on the same noise; the figures of the bench."""
    def run(strategy: Strategy) -> SimResult:
        return simulate(costs, units, strategy, rounds=rounds, noise=noise, seed=seed,
                        smoothing=smoothing, hysteresis=hysteresis)

    static, balanced = run("static"), run("balanced")
    return {
        "costs": dict(costs),
        "units": units,
        "rounds": rounds,
        "noise": noise,
        "seed": seed,
        "static": {"total_makespan": static.total_makespan,
                   "idle_fraction": static.idle_fraction, "units": static.last_units},
        "balanced": {"total_makespan": balanced.total_makespan,
                     "idle_fraction": balanced.idle_fraction, "units": balanced.last_units,
                     "rebalances": balanced.rebalances},
        "makespan_ratio_balanced_over_static": balanced.total_makespan / static.total_makespan,
    }
