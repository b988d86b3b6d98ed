"""Local mode: the pool is this machine's CPU threads; what a trainer does with an allocation.

Local and cluster mode go through the same code: an `Allocation` always carries `threads` (CPU
threads for torch), `rollout_budget` (samples this round), `worker_ids`/`slices` and
`rollout_addresses` (cluster mode: where the policy's GPUs and rollout servers are).
"""

from __future__ import annotations

import os
import re
import socket
from typing import Protocol


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


def local_worker(worker_id: str | None = None,
                 slots: int | None = None) -> tuple[str, int, dict[str, str]]:
    """(worker id, CPU slots, labels) describing this machine as a local-mode worker.

    The id defaults to ``local-<hostname>`` (sanitised to the id alphabet), the slots to
    ``os.cpu_count()``.
    """
    host = socket.gethostname()
    wid = worker_id or "local-" + re.sub(r"[^A-Za-z0-9._-]", "-", host)[:100]
    cpu = slots if slots is not None else (os.cpu_count() or 1)
    return wid, cpu, {"host": host[:1024], "mode": "local"}
