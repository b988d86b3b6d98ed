from mutualrl.v1 import runs_pb2 as _runs_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerCapacity(_message.Message):
    __slots__ = ("cpu_slots", "gpu_count", "gpu_kind")
    CPU_SLOTS_FIELD_NUMBER: _ClassVar[int]
    GPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    GPU_KIND_FIELD_NUMBER: _ClassVar[int]
    cpu_slots: int
    gpu_count: int
    gpu_kind: str
    def __init__(self, cpu_slots: _Optional[int] = ..., gpu_count: _Optional[int] = ..., gpu_kind: _Optional[str] = ...) -> None: ...

class Worker(_message.Message):
    __slots__ = ("worker_id", "capacity", "labels", "rollout_address")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    capacity: WorkerCapacity
    labels: _containers.ScalarMap[str, str]
    rollout_address: str
    def __init__(self, worker_id: _Optional[str] = ..., capacity: _Optional[_Union[WorkerCapacity, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., rollout_address: _Optional[str] = ...) -> None: ...

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("run_id", "worker")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    worker: Worker
    def __init__(self, run_id: _Optional[str] = ..., worker: _Optional[_Union[Worker, _Mapping]] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("worker_id", "lease_seconds", "expires_unix_ms")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    lease_seconds: float
    expires_unix_ms: int
    def __init__(self, worker_id: _Optional[str] = ..., lease_seconds: _Optional[float] = ..., expires_unix_ms: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("run_id", "worker_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    worker_id: str
    def __init__(self, run_id: _Optional[str] = ..., worker_id: _Optional[str] = ...) -> None: ...

class DeregisterWorkerRequest(_message.Message):
    __slots__ = ("run_id", "worker_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    worker_id: str
    def __init__(self, run_id: _Optional[str] = ..., worker_id: _Optional[str] = ...) -> None: ...

class DeregisterWorkerResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: bool
    def __init__(self, removed: _Optional[bool] = ...) -> None: ...

class RegisterPolicyRequest(_message.Message):
    __slots__ = ("run_id", "policy_id", "trainer_id", "min_units", "weight", "rollout_budget", "max_rollout_workers")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    TRAINER_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_UNITS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_BUDGET_FIELD_NUMBER: _ClassVar[int]
    MAX_ROLLOUT_WORKERS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    policy_id: str
    trainer_id: str
    min_units: int
    weight: float
    rollout_budget: int
    max_rollout_workers: int
    def __init__(self, run_id: _Optional[str] = ..., policy_id: _Optional[str] = ..., trainer_id: _Optional[str] = ..., min_units: _Optional[int] = ..., weight: _Optional[float] = ..., rollout_budget: _Optional[int] = ..., max_rollout_workers: _Optional[int] = ...) -> None: ...

class PolicyInfo(_message.Message):
    __slots__ = ("run_id", "policy_id", "trainer_id", "smoothed_cost", "live", "last_seen_unix_ms", "min_units", "weight", "rollout_budget", "reports", "last_seconds", "last_tokens", "last_samples", "last_units", "last_round", "max_rollout_workers", "smoothed_rollout_cost", "smoothed_update_cost", "last_rollout_seconds", "last_update_seconds")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    TRAINER_ID_FIELD_NUMBER: _ClassVar[int]
    SMOOTHED_COST_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_UNITS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_BUDGET_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    LAST_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LAST_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LAST_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    LAST_UNITS_FIELD_NUMBER: _ClassVar[int]
    LAST_ROUND_FIELD_NUMBER: _ClassVar[int]
    MAX_ROLLOUT_WORKERS_FIELD_NUMBER: _ClassVar[int]
    SMOOTHED_ROLLOUT_COST_FIELD_NUMBER: _ClassVar[int]
    SMOOTHED_UPDATE_COST_FIELD_NUMBER: _ClassVar[int]
    LAST_ROLLOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LAST_UPDATE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    policy_id: str
    trainer_id: str
    smoothed_cost: float
    live: bool
    last_seen_unix_ms: int
    min_units: int
    weight: float
    rollout_budget: int
    reports: int
    last_seconds: float
    last_tokens: int
    last_samples: int
    last_units: int
    last_round: int
    max_rollout_workers: int
    smoothed_rollout_cost: float
    smoothed_update_cost: float
    last_rollout_seconds: float
    last_update_seconds: float
    def __init__(self, run_id: _Optional[str] = ..., policy_id: _Optional[str] = ..., trainer_id: _Optional[str] = ..., smoothed_cost: _Optional[float] = ..., live: _Optional[bool] = ..., last_seen_unix_ms: _Optional[int] = ..., min_units: _Optional[int] = ..., weight: _Optional[float] = ..., rollout_budget: _Optional[int] = ..., reports: _Optional[int] = ..., last_seconds: _Optional[float] = ..., last_tokens: _Optional[int] = ..., last_samples: _Optional[int] = ..., last_units: _Optional[int] = ..., last_round: _Optional[int] = ..., max_rollout_workers: _Optional[int] = ..., smoothed_rollout_cost: _Optional[float] = ..., smoothed_update_cost: _Optional[float] = ..., last_rollout_seconds: _Optional[float] = ..., last_update_seconds: _Optional[float] = ...) -> None: ...

class PolicyHeartbeatRequest(_message.Message):
    __slots__ = ("run_id", "policy_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    policy_id: str
    def __init__(self, run_id: _Optional[str] = ..., policy_id: _Optional[str] = ...) -> None: ...

class DeregisterPolicyRequest(_message.Message):
    __slots__ = ("run_id", "policy_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    policy_id: str
    def __init__(self, run_id: _Optional[str] = ..., policy_id: _Optional[str] = ...) -> None: ...

class DeregisterPolicyResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: bool
    def __init__(self, removed: _Optional[bool] = ...) -> None: ...

class StepCostReport(_message.Message):
    __slots__ = ("run_id", "policy_id", "round", "seconds", "tokens", "samples", "units", "rollout_seconds", "update_seconds", "rollout_units")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    UPDATE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_UNITS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    policy_id: str
    round: int
    seconds: float
    tokens: int
    samples: int
    units: int
    rollout_seconds: float
    update_seconds: float
    rollout_units: int
    def __init__(self, run_id: _Optional[str] = ..., policy_id: _Optional[str] = ..., round: _Optional[int] = ..., seconds: _Optional[float] = ..., tokens: _Optional[int] = ..., samples: _Optional[int] = ..., units: _Optional[int] = ..., rollout_seconds: _Optional[float] = ..., update_seconds: _Optional[float] = ..., rollout_units: _Optional[int] = ...) -> None: ...

class StepCostAck(_message.Message):
    __slots__ = ("policy",)
    POLICY_FIELD_NUMBER: _ClassVar[int]
    policy: PolicyInfo
    def __init__(self, policy: _Optional[_Union[PolicyInfo, _Mapping]] = ...) -> None: ...

class GetAllocationRequest(_message.Message):
    __slots__ = ("run_id", "policy_id", "round")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    policy_id: str
    round: int
    def __init__(self, run_id: _Optional[str] = ..., policy_id: _Optional[str] = ..., round: _Optional[int] = ...) -> None: ...

class Allocation(_message.Message):
    __slots__ = ("run_id", "policy_id", "epoch", "round", "worker_ids", "units", "threads", "rollout_budget", "active", "strategy", "rollout_addresses", "slices", "pool_units", "rollout_workers", "rollout_threads", "rollout_units")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    WORKER_IDS_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_BUDGET_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    SLICES_FIELD_NUMBER: _ClassVar[int]
    POOL_UNITS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_WORKERS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_THREADS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_UNITS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    policy_id: str
    epoch: int
    round: int
    worker_ids: _containers.RepeatedScalarFieldContainer[str]
    units: int
    threads: int
    rollout_budget: int
    active: bool
    strategy: str
    rollout_addresses: _containers.RepeatedScalarFieldContainer[str]
    slices: _containers.RepeatedCompositeFieldContainer[WorkerSlice]
    pool_units: int
    rollout_workers: int
    rollout_threads: int
    rollout_units: int
    def __init__(self, run_id: _Optional[str] = ..., policy_id: _Optional[str] = ..., epoch: _Optional[int] = ..., round: _Optional[int] = ..., worker_ids: _Optional[_Iterable[str]] = ..., units: _Optional[int] = ..., threads: _Optional[int] = ..., rollout_budget: _Optional[int] = ..., active: _Optional[bool] = ..., strategy: _Optional[str] = ..., rollout_addresses: _Optional[_Iterable[str]] = ..., slices: _Optional[_Iterable[_Union[WorkerSlice, _Mapping]]] = ..., pool_units: _Optional[int] = ..., rollout_workers: _Optional[int] = ..., rollout_threads: _Optional[int] = ..., rollout_units: _Optional[int] = ...) -> None: ...

class WorkerSlice(_message.Message):
    __slots__ = ("worker_id", "units", "rollout_address")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    units: int
    rollout_address: str
    def __init__(self, worker_id: _Optional[str] = ..., units: _Optional[int] = ..., rollout_address: _Optional[str] = ...) -> None: ...

class WatchAllocationRequest(_message.Message):
    __slots__ = ("run_id", "policy_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    policy_id: str
    def __init__(self, run_id: _Optional[str] = ..., policy_id: _Optional[str] = ...) -> None: ...

class ListAllocationsRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class WorkerState(_message.Message):
    __slots__ = ("worker", "lease", "state", "holder", "units_by_policy", "units")
    class UnitsByPolicyEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    WORKER_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    UNITS_BY_POLICY_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    worker: Worker
    lease: Lease
    state: str
    holder: str
    units_by_policy: _containers.ScalarMap[str, int]
    units: int
    def __init__(self, worker: _Optional[_Union[Worker, _Mapping]] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., state: _Optional[str] = ..., holder: _Optional[str] = ..., units_by_policy: _Optional[_Mapping[str, int]] = ..., units: _Optional[int] = ...) -> None: ...

class AllocationTable(_message.Message):
    __slots__ = ("run_id", "allocations", "workers", "policies", "idle_units", "epoch", "round", "strategy", "leader", "pool_units")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    IDLE_UNITS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    POOL_UNITS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    allocations: _containers.RepeatedCompositeFieldContainer[Allocation]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerState]
    policies: _containers.RepeatedCompositeFieldContainer[PolicyInfo]
    idle_units: int
    epoch: int
    round: int
    strategy: str
    leader: str
    pool_units: int
    def __init__(self, run_id: _Optional[str] = ..., allocations: _Optional[_Iterable[_Union[Allocation, _Mapping]]] = ..., workers: _Optional[_Iterable[_Union[WorkerState, _Mapping]]] = ..., policies: _Optional[_Iterable[_Union[PolicyInfo, _Mapping]]] = ..., idle_units: _Optional[int] = ..., epoch: _Optional[int] = ..., round: _Optional[int] = ..., strategy: _Optional[str] = ..., leader: _Optional[str] = ..., pool_units: _Optional[int] = ...) -> None: ...
