"""This trainer's side of MWRA: register the policy, read the round's allocation, report cost.

Without an MWRA address the allocation is fixed (configured threads, the full rollout budget).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Protocol

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
        import torch

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


class AllocatorClient:
    """MWRA through `mutualrl.client.mwra`; `address=None` gives the fixed allocation."""

    def __init__(self, address: str | None, run_id: str, policy: str, threads: int,
                 rollout_budget: int, token: str | None = None, timeout: float = 30.0,
                 active_wait_s: float = 60.0) -> None:
        self.run_id, self.policy = run_id, policy
        self.fixed = RoundAllocation(threads=threads, rollout_budget=rollout_budget)
        self.current = self.fixed
        self.active_wait_s = active_wait_s
        self.waited_s = 0.0
        """Seconds spent waiting for a time-share turn so far (not part of a step's cost)."""
        self.warned_empty_pool = False
        self.client: Any = None
        if address is None:
            return
        from mutualrl.client.mwra import MwraClient

        self.client = MwraClient(address, token=token, timeout=timeout)
        self.client.register_policy(run_id, policy, trainer_id=f"{policy}-{os.getpid()}",
                                    rollout_budget=rollout_budget)

    def allocation(self, round_k: int) -> RoundAllocation:
        """The allocation for `round_k`. Under time-sharing a policy that sits the round out
        waits (bounded by `active_wait_s`) until it holds the pool: rounds are never skipped,
        so every policy still answers every round of the shared prompt order."""
        if self.client is None:
            return self.fixed
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
        self.current = RoundAllocation(
            threads=max(int(a.threads), 1),
            rollout_budget=int(a.rollout_budget) or self.fixed.rollout_budget,
            units=max(int(a.units), 1), epoch=int(a.epoch), round_peers=peers)
        return self.current

    def report(self, round_k: int, seconds: float, tokens: int, samples: int) -> None:
        """Report a round's cost: `seconds` of work, waits for peers, deadlines and turns
        excluded (MWRA divides compute by it)."""
        if self.client is not None:
            self.client.report_step_cost(self.run_id, self.policy, round_k, max(seconds, 1e-6),
                                         tokens=tokens, samples=samples,
                                         units=self.current.units)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
