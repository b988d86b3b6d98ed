"""Local mode: the pool is this machine's CPU threads, offered to MWRA as one worker.

Local and cluster mode go through the same code: an `Allocation` always carries `threads` (CPU
threads for torch), `rollout_budget` (samples this round), `worker_ids`/`slices` and
`rollout_addresses` (cluster mode: where the policy's GPUs and rollout servers are). The trainer
applies an allocation with `mutualrl.trainer.runtime.allocator.apply_allocation`.
"""

from __future__ import annotations

import os
import re
import socket


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
