"""Configuration of MWRA: the `mwra:` section of a run YAML (see configs/mwra.yaml)."""

from __future__ import annotations

import os
import warnings
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from mutualrl.common.bounds import DEFAULT_MAX_ROUND_AHEAD, MAX_ROUND
from mutualrl.common.config import ServiceConfig
from mutualrl.mwra.allocation import Strategy

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def _redis_url_from_env() -> str:
    return os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL


MAX_LABEL_BYTES = 8 * 1024
"""UTF-8 bytes of one worker's labels, keys and values together."""
MAX_ADDRESS_CHARS = 261
"""Longest rollout address: a 255-character host, a colon and a port."""
WORKER_BYTES = MAX_LABEL_BYTES + 64 * 8 + 128 + 128 + MAX_ADDRESS_CHARS + 128
"""A WorkerState at most: labels and their framing, id, GPU kind, address, lease, counts."""
SLICE_BYTES = 2 * (128 + MAX_ADDRESS_CHARS) + 16
"""What one worker adds to one policy's Allocation at most: its id and address, twice (the
slice and the flat lists), and the units."""
HOLDER_BYTES = 2 * 128 + 16
"""What one policy holding a worker adds to its WorkerState: its id in `holder` and in
`units_by_policy`."""
POLICY_BYTES = 2 * 1024
"""A PolicyInfo and an Allocation's own fields at most (ids, counts, strategy)."""


def table_bound(workers: int, policies: int) -> int:
    """The largest AllocationTable a run of `workers` and `policies` can have: every policy
    may hold a slice of every worker."""
    return (workers * WORKER_BYTES + policies * POLICY_BYTES
            + workers * policies * (SLICE_BYTES + HOLDER_BYTES) + 1024)


def _short_pool_alias(value: Any) -> Any:
    """`share`, the earlier name of `shared`, is accepted for one more release."""
    if value == "share":
        warnings.warn("mwra.short_pool: `share` is now called `shared`", DeprecationWarning,
                      stacklevel=2)
        return "shared"
    return value


class MwraConfig(ServiceConfig):
    """The allocator service: where it listens, where its state lives, how it allocates."""

    port: int = Field(default=50053, ge=0, le=65535)
    """gRPC port (0 picks a free one)."""
    metrics_port: int | None = Field(default=9103, ge=0, le=65535)
    """Prometheus /metrics port; None serves none (0 picks a free one)."""
    redis_url: str = Field(default_factory=_redis_url_from_env)
    """Redis holding workers, leases, policies, costs and allocations (keys
    `<key_prefix>:mwra:{<run>}:...`); a Redis Cluster as redis+cluster://host:port[,...].
    Defaults to the REDIS_URL environment variable, else redis://127.0.0.1:6379/0."""
    redis_timeout_seconds: float = Field(default=5.0, gt=0)
    """Connect and per-command timeout towards Redis; calls fail with UNAVAILABLE past it."""
    redis_max_connections: int = Field(default=64, ge=1)
    """Connections to Redis at most; a call that finds none free waits for one (up to
    `redis_timeout_seconds`, then UNAVAILABLE) rather than failing at once."""
    strategy: Strategy = "balanced"
    """Allocation policy: `static` (fixed shares by weight), `balanced` (min-makespan from
    measured step costs), `time-share` (policies take turns on the pool). `static` and
    `balanced` fall back to time-share in rounds where the pool cannot give every live policy
    its minimum."""
    unit: Literal["auto", "cpu", "gpu"] = "auto"
    """What the pool is counted in: `cpu` threads (local mode), `gpu`s (cluster mode), or `auto`:
    GPUs when any live worker has one, else CPU slots."""
    worker_lease_seconds: float = Field(default=10.0, gt=0)
    """A worker whose last heartbeat is older than this is lost; workers should heartbeat every
    third of it."""
    policy_lease_seconds: float = Field(default=120.0, gt=0)
    """A policy with no register/report/heartbeat/GetAllocation for this long is gone and its
    units are released at the next rebalance (longer than the longest training step, or send
    PolicyHeartbeat)."""
    smoothing: float = Field(default=0.3, gt=0, le=1)
    """EMA weight of the newest step cost (1 = use only the last step)."""
    hysteresis: float = Field(default=0.1, ge=0)
    """`balanced` keeps the current split unless the optimal makespan is at least this much
    (relative) shorter: 0.1 = move only for a >= 10% gain, so noisy costs do not thrash it."""
    short_pool: Annotated[Literal["auto", "shared", "time-share"],
                          BeforeValidator(_short_pool_alias)] = "auto"
    """When the pool has fewer units than the live policies need (`static`, `balanced`):
    `shared` (also accepted as `share`, its earlier name) keeps every policy active and
    over-commits the units (the OS time-slices CPU threads: N trainers cost about the sum of
    their steps over the cores, never more than one after another), each policy with the
    fewest threads that finish its round within that pooled time (at least its minimum: a
    slow policy takes the threads its peers leave idle while they wait for it); `time-share`
    makes policies take turns within each round (exclusive units such as GPUs: a round costs
    the turns' steps one after another); `auto`: `shared` for CPU units, `time-share` for
    GPUs. Plans report `shared` as their strategy."""
    turn_policies: int | None = Field(default=None, ge=1)
    """`time-share`: most policies active in one round (None: as many as the pool fits;
    1: each round one policy holds the whole pool)."""
    lock_ttl_seconds: float = Field(default=5.0, gt=0)
    """TTL of a run's leader lock; a follower takes over this long after the leader died."""
    tick_seconds: float = Field(default=0.25, gt=0)
    """Period of the background loop that renews the lock, marks lost workers and serves
    rebalance requests forwarded by followers (keep well below lock_ttl and the leases)."""
    follower_wait_seconds: float = Field(default=10.0, ge=0)
    """How long a follower waits for the leader to make an allocation for a new round before
    answering with the current one."""
    watch_poll_seconds: float = Field(default=0.2, gt=0)
    """WatchAllocation re-reads Redis this often (changes by any replica are seen)."""
    max_worker_cpu_slots: int = Field(default=1 << 16, ge=1)
    """Most CPU slots one worker may declare (RegisterWorker; larger is INVALID_ARGUMENT)."""
    max_worker_gpus: int = Field(default=1 << 10, ge=1)
    """Most GPUs one worker may declare (RegisterWorker)."""
    max_units: int = Field(default=1 << 20, ge=1)
    """Most units a policy may ask for or report a step on (RegisterPolicy `min_units`,
    ReportStepCost `units`)."""
    max_step_seconds: float = Field(default=1e6, gt=0)
    """Longest step ReportStepCost accepts, in seconds (about 11.6 days)."""
    max_weight: float = Field(default=1e6, gt=0)
    """Largest `static` share weight RegisterPolicy accepts."""
    max_workers: int = Field(default=256, ge=1, le=65_536)
    """Most workers one run holds; registering one more is RESOURCE_EXHAUSTED naming
    `worker.worker_id` (DeregisterWorker or DeleteRun frees room). With `max_policies` it
    bounds a run's state, what each call loads, and the largest answer (ListAllocations: each
    policy's slices of every worker), which must fit `max_message_bytes`."""
    max_policies: int = Field(default=128, ge=1, le=65_536)
    """Most policies one run holds (RegisterPolicy beyond: RESOURCE_EXHAUSTED naming
    `policy_id`)."""
    max_round_ahead: int = Field(default=DEFAULT_MAX_ROUND_AHEAD, ge=1, le=MAX_ROUND)
    """Rounds past the run's current round (the round of its plan, or the latest a policy
    reported a step of) GetAllocation and ReportStepCost may name; beyond it INVALID_ARGUMENT,
    so one request cannot pin the run's plan at a round nobody reaches. A run without a plan
    or a report takes any first round up to 2^31 - 1 (`mutualrl.common.bounds`)."""
    replica_id: str | None = None
    """Name of this replica in the leader lock; None: <hostname>-<random> (a stable name lets a
    restarted replica reclaim its lock at once)."""

    @model_validator(mode="after")
    def _answers_fit(self) -> MwraConfig:
        worst = table_bound(self.max_workers, self.max_policies)
        if worst > self.max_message_bytes - (64 << 10):
            raise ValueError(f"max_workers={self.max_workers} and max_policies="
                             f"{self.max_policies} allow an allocation table of {worst} bytes, "
                             f"over max_message_bytes ({self.max_message_bytes}) less 64 KiB")
        return self

    @model_validator(mode="after")
    def _tick_below_ttl(self) -> MwraConfig:
        if self.tick_seconds >= self.lock_ttl_seconds:
            raise ValueError("tick_seconds must be below lock_ttl_seconds, or the lock lapses "
                             "between renewals")
        return self
