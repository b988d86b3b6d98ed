"""Prometheus metrics of MWRA (per-method call counts and latency come from `start_server`)."""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge

ALLOCATED = Gauge("mutualrl_mwra_allocated_units", "Units allocated to a policy in the current "
                  "plan.", ["run", "policy"])
IDLE = Gauge("mutualrl_mwra_idle_units", "Units of the live pool no policy holds.", ["run"])
POOL = Gauge("mutualrl_mwra_pool_units", "Units of the live pool.", ["run"])
REBALANCES = Counter("mutualrl_mwra_rebalances", "Plans that changed who holds what.", ["run"])
LOST = Counter("mutualrl_mwra_lost_workers", "Workers whose lease lapsed.", ["run"])
LEADER = Gauge("mutualrl_mwra_leader", "1 while this replica holds the run's leader lock.",
               ["run"])
COST = Gauge("mutualrl_mwra_policy_cost_unit_seconds", "Smoothed step cost (unit-seconds per "
             "round).", ["run", "policy"])

_PER_RUN = (IDLE, POOL, REBALANCES, LOST, LEADER)
_PER_POLICY = (ALLOCATED, COST)


def forget_run(run_id: str) -> None:
    """Drop a deleted run's series, so /metrics stops reporting it."""
    for metric in _PER_RUN:
        with contextlib.suppress(KeyError):  # never exported on this replica
            metric.remove(run_id)
    for metric in _PER_POLICY:
        policies = {sample.labels["policy"] for family in metric.collect()
                    for sample in family.samples if sample.labels.get("run") == run_id}
        for policy in policies:
            metric.remove(run_id, policy)
