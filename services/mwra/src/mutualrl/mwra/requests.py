"""Validation of MWRA's requests (pure: no grpc, no redis); the servicer runs these before it
touches the store. Each rule raises `InvalidArgument` naming the offending field; capacities,
unit counts, weights and step seconds are bounded by `MwraConfig.max_*`."""

from __future__ import annotations

import math
import re

from mutualrl.common import bounds, ids
from mutualrl.common.errors import InvalidArgument, quote
from mutualrl.mwra.config import MAX_ADDRESS_CHARS, MAX_LABEL_BYTES, MwraConfig
from mutualrl.v1 import allocation_pb2 as pb

ADDRESS_RE = re.compile(r"^[^\s:]+:\d{1,5}$|^\[[0-9A-Fa-f:.]+\]:\d{1,5}$")


def check_id(field: str, value: str) -> str:
    """Worker, policy and trainer ids follow `ids.NAME` (run ids: `ids.RUN_ID`)."""
    return ids.check_name(value, field)


def finite(field: str, value: float, *, positive: bool = False,
           limit: float | None = None) -> float:
    if math.isnan(value) or math.isinf(value):
        raise InvalidArgument(field, f"must be finite, got {value}")
    if positive and value <= 0:
        raise InvalidArgument(field, f"must be > 0, got {value}")
    if value < 0:
        raise InvalidArgument(field, f"must be >= 0, got {value}")
    if limit is not None and value > limit:
        raise InvalidArgument(field, f"must be <= {limit:g}, got {value:g}")
    return value


def nonneg(field: str, value: int, limit: int | None = None) -> int:
    if value < 0:
        raise InvalidArgument(field, f"must be >= 0, got {value}")
    if limit is not None and value > limit:
        raise InvalidArgument(field, f"must be <= {limit}, got {value}")
    return value


def check_worker(request: pb.RegisterWorkerRequest, cfg: MwraConfig) -> str:
    """The worker of a RegisterWorker request; returns its id."""
    if not request.HasField("worker"):
        raise InvalidArgument("worker", "is required")
    w = request.worker
    wid = check_id("worker.worker_id", w.worker_id)
    cap = w.capacity
    nonneg("worker.capacity.cpu_slots", cap.cpu_slots, cfg.max_worker_cpu_slots)
    nonneg("worker.capacity.gpu_count", cap.gpu_count, cfg.max_worker_gpus)
    if cap.cpu_slots == 0 and cap.gpu_count == 0:
        raise InvalidArgument("worker.capacity", "zero capacity: cpu_slots or gpu_count "
                              "must be > 0")
    if w.rollout_address and (len(w.rollout_address) > MAX_ADDRESS_CHARS
                              or not ADDRESS_RE.match(w.rollout_address)):
        raise InvalidArgument("worker.rollout_address",
                              f"{quote(w.rollout_address)} is not host:port (at most "
                              f"{MAX_ADDRESS_CHARS} characters)")
    if len(w.labels) > 64 or any(len(k) > 128 or len(v) > 1024 for k, v in w.labels.items()):
        raise InvalidArgument("worker.labels", "at most 64 labels, keys <= 128 and values "
                              "<= 1024 characters")
    size = sum(len(k.encode()) + len(v.encode()) for k, v in w.labels.items())
    if size > MAX_LABEL_BYTES:
        raise InvalidArgument("worker.labels", f"{size} bytes of UTF-8 in all, over the "
                              f"{MAX_LABEL_BYTES}-byte limit")
    if len(cap.gpu_kind) > 128:
        raise InvalidArgument("worker.capacity.gpu_kind", "at most 128 characters")
    return wid


def check_policy(request: pb.RegisterPolicyRequest, cfg: MwraConfig) -> float:
    """The fields of a RegisterPolicy request past its ids; returns the weight (0 = 1.0)."""
    if request.trainer_id:
        check_id("trainer_id", request.trainer_id)
    if request.min_units < 0:
        raise InvalidArgument("min_units", f"must be >= 1 (0 = 1), got {request.min_units}")
    nonneg("min_units", request.min_units, cfg.max_units)
    weight = finite("weight", request.weight, limit=cfg.max_weight) or 1.0
    nonneg("rollout_budget", request.rollout_budget)
    nonneg("max_rollout_workers", request.max_rollout_workers, cfg.max_units)
    return weight


def check_cost(request: pb.StepCostReport, cfg: MwraConfig) -> float:
    """The fields of a ReportStepCost request past its ids and its round (a round of the run:
    the servicer checks it against the run's current round); returns the step's seconds."""
    seconds = finite("seconds", request.seconds, positive=True, limit=cfg.max_step_seconds)
    nonneg("tokens", request.tokens, bounds.MAX_COUNT)
    nonneg("samples", request.samples, bounds.MAX_COUNT)
    if request.units < 1:
        raise InvalidArgument("units", f"must be >= 1, got {request.units}")
    nonneg("units", request.units, cfg.max_units)
    finite("rollout_seconds", request.rollout_seconds, limit=cfg.max_step_seconds)
    finite("update_seconds", request.update_seconds, limit=cfg.max_step_seconds)
    nonneg("rollout_units", request.rollout_units)
    if request.rollout_units >= request.units:
        raise InvalidArgument("rollout_units", f"must be < units ({request.units}): the "
                              f"learner keeps at least one, got {request.rollout_units}")
    return seconds
