"""This trainer's side of MWRA: register the policy, read the round's allocation, report cost.

Without an MWRA address the allocation is fixed (configured threads, the full rollout budget).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc
import torch

from mutualrl.client.mwra import MwraClient

log = logging.getLogger(__name__)


class AllocationLike(Protocol):
    """What `apply_allocation` reads (an `allocation_pb2.Allocation` has it)."""

    threads: int
    rollout_budget: int
    active: bool


def apply_allocation(alloc: AllocationLike) -> int:
    """Apply an allocation to this process and return the round's rollout budget.

    Sets ``torch.set_num_threads(alloc.threads)`` when the allocation grants threads (a policy
    that sits the round out under time-share gets 0 threads: the setting is left as it is and
    the budget is 0, meaning "skip this round"). torch is imported here, not at module import.
    """
    if alloc.threads >= 1:
        torch.set_num_threads(int(alloc.threads))
    return int(alloc.rollout_budget) if alloc.active else 0


@dataclass
class RoundAllocation:
    threads: int
    rollout_budget: int
    units: int = 1
    epoch: int = 0
    round_peers: list[str] | None = None
    """time-share: the policies training this turn of the round (this one included); peers in
    later turns cannot have published the round yet, so probes do not wait for them. None:
    every policy trains the round together."""
    rollout_workers: int = 0
    """Rollout workers granted to the policy (`policies[].rollout_worker: auto` samples in one
    when >= 1); 0: rollouts in-process."""
    rollout_threads: int = 0
    """Of `threads`, those the rollout worker uses (the learner the rest); 0: the trainer's
    default split (half)."""
    rollout_units: int = 0
    """Of `units`, those the rollout workers hold (reported back with the round's cost)."""


def fixed_allocation(threads: int, rollout_budget: int,
                     max_rollout_workers: int) -> RoundAllocation:
    """The allocation without MWRA's grants: the configured threads and budget, and every
    rollout worker the trainer runs, on half the threads (none of its own on one thread: the
    worker and the learner then share it)."""
    half = threads // 2 if max_rollout_workers > 0 else 0
    return RoundAllocation(threads=threads, rollout_budget=rollout_budget,
                           rollout_workers=max_rollout_workers, rollout_threads=half,
                           rollout_units=half)


class AllocatorClient:
    """MWRA through `mutualrl.client.mwra`; `address=None` gives the fixed allocation."""

    def __init__(self, address: str | None, run_id: str, policy: str, threads: int,
                 rollout_budget: int, token: str | None = None, timeout: float = 30.0,
                 active_wait_s: float = 60.0, peers: Sequence[str] = (),
                 peers_wait_s: float = 0.0, fixed_compute: bool = False,
                 outage_budget: float | None = None, max_rollout_workers: int = 0) -> None:
        self.run_id, self.policy = run_id, policy
        self.fixed = fixed_allocation(threads, rollout_budget, max_rollout_workers)
        self.current = self.fixed
        self.active_wait_s = active_wait_s
        self.peers = [p for p in peers if p != policy]
        """The run's other policies still to wait for (up to `peers_wait_s`) before round 0;
        emptied by the first allocation asked for."""
        self.peers_wait_s = peers_wait_s
        self.fixed_compute = fixed_compute
        """Keep the configured threads and the full rollout budget whatever MWRA grants (the
        deterministic mode: MWRA's grants follow measured step times, and a step on other
        threads rounds differently); MWRA's turns and cost reports still apply."""
        self.waited_s = 0.0
        """Seconds spent waiting for a time-share turn or for peers to register so far (not
        part of a step's cost)."""
        self.warned_empty_pool = False
        self.client: MwraClient | None = None
        if address is None:
            return

        budget = {} if outage_budget is None else {"outage_budget": outage_budget}
        self.client = MwraClient(address, token=token, timeout=timeout, **budget)
        self.client.register_policy(run_id, policy, trainer_id=f"{policy}-{os.getpid()}",
                                    rollout_budget=rollout_budget,
                                    max_rollout_workers=max_rollout_workers)

    def allocation(self, round_k: int) -> RoundAllocation:
        """The allocation for `round_k`. Under time-sharing a policy that sits the round out
        waits (bounded by `active_wait_s`) until it holds the pool: rounds are never skipped,
        so every policy still answers every round of the shared prompt order."""
        if self.client is None:
            return self.fixed
        if round_k == 0:
            self._await_peers()
        self.peers = []
        start = time.monotonic()
        give_up = start + self.active_wait_s
        turns = 0
        while True:
            a = self.client.get_allocation(self.run_id, self.policy, round_k)
            if a.pool_units == 0:
                # No worker registered for the run: nothing to share out, so waiting for a turn
                # could only stall the round. Train with the configured threads instead.
                if not self.warned_empty_pool:
                    log.warning("MWRA has no workers for run %s: using %d thread(s)",
                                self.run_id, self.fixed.threads)
                    self.warned_empty_pool = True
                self.current = self.fixed
                return self.current
            if a.active or time.monotonic() > give_up:
                break
            time.sleep(0.05)
            turns += 1
        if turns:
            self.waited_s += time.monotonic() - start
        peers = None
        if a.strategy == "time-share" and a.active:
            table = self.client.list_allocations(self.run_id)
            peers = sorted({x.policy_id for x in table.allocations if x.active} | {self.policy})
        f = self.fixed
        # threads, budget, rollout workers, their threads and units
        granted = ((f.threads, 0, f.rollout_workers, f.rollout_threads, f.rollout_units)
                   if self.fixed_compute else
                   (a.threads, a.rollout_budget, a.rollout_workers, a.rollout_threads,
                    a.rollout_units))
        self.current = RoundAllocation(
            threads=max(int(granted[0]), 1),
            rollout_budget=int(granted[1]) or f.rollout_budget,
            units=max(int(a.units), 1), epoch=int(a.epoch), round_peers=peers,
            rollout_workers=int(granted[2]), rollout_threads=int(granted[3]),
            rollout_units=int(granted[4]))
        return self.current

    def _await_peers(self) -> None:
        """Wait, up to `peers_wait_s`, until every peer policy is registered with MWRA.

        MWRA plans a round for the policies it knows when the round is first asked for. A
        trainer that asks for round 0 before its peers have loaded their models and registered
        holds the whole pool in it (more threads than meant), and since a step on more threads
        rounds differently, the run's numbers would depend on which trainer started first.
        Launchers that register the run's policies beforehand (`declare_policies`) pass at once.
        Past the bound the round is planned without the missing peers, as before."""
        missing = set(self.peers)
        client = self.client
        if client is None or not missing or self.peers_wait_s <= 0:
            return
        start = time.monotonic()
        # a bound past MWRA's policy lease must not expire this policy while it waits
        with client.policy_keepalive(self.run_id, self.policy, 10.0):
            while True:
                listed = client.list_allocations(self.run_id).policies
                missing -= {p.policy_id for p in listed}
                if not missing:
                    break
                if time.monotonic() - start >= self.peers_wait_s:
                    log.warning("run %s: %s not registered with MWRA after %g s; round 0 is "
                                "planned without them", self.run_id,
                                ", ".join(sorted(missing)), self.peers_wait_s)
                    break
                time.sleep(0.1)
        self.waited_s += time.monotonic() - start

    def report(self, round_k: int, seconds: float, tokens: int, samples: int, *,
               rollout_s: float = 0.0, update_s: float = 0.0) -> None:
        """Report a round's cost: `seconds` of work, waits for peers, deadlines and turns
        excluded (MWRA divides compute by it); `rollout_s` and `update_s` the round's time
        generating and updating (they overlap with rollout workers; 0 = not measured), from
        which MWRA splits the policy's threads between its learner and its workers."""
        if self.client is not None:
            units = self.current.units
            # MWRA's units, when fixed compute ran the round on other threads than granted
            rollout_units = min(self.current.rollout_units, units - 1)
            self.client.report_step_cost(self.run_id, self.policy, round_k, max(seconds, 1e-6),
                                         tokens=tokens, samples=samples, units=units,
                                         rollout_seconds=max(rollout_s, 0.0),
                                         update_seconds=max(update_s, 0.0),
                                         rollout_units=max(rollout_units, 0))

    def leave(self) -> None:
        """This policy trained its last round: deregister it, so MWRA hands its threads to the
        policies still training (a fast policy's finish would otherwise leave them idle while
        a slow one trains on its old share)."""
        if self.client is None:
            return
        try:
            self.client.deregister_policy(self.run_id, self.policy)
        except grpc.RpcError as err:  # the policy's lease lapses instead
            log.warning("MWRA did not take %s's leave (%s): its threads return to the pool "
                        "when its lease lapses", self.policy, err.code().name)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
