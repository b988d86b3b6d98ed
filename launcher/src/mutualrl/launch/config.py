"""The `up:` and `warm_start:` sections of a run YAML: how `mutualrl up` runs the platform."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from mutualrl.common.config import Config


class UpConfig(Config):
    """How `mutualrl up` supervises the processes of a run."""

    restart: Literal["never", "on-failure"] = "never"
    """A service or trainer that dies: stop the run (never) or start it again (on-failure,
    trainers resume from their latest checkpoint)."""
    max_restarts: int = Field(2, ge=0)
    """Restarts allowed per trainer with `on-failure` before the run stops (each resumes from
    its latest checkpoint); also per service unless `service_restarts` is set."""
    service_restarts: int | None = Field(None, ge=0)
    """Restarts allowed per service (SEE, THL, MWRA) with `on-failure` before the run stops;
    None: `max_restarts`. A service keeps its state in Redis, so its restart costs the trainers
    a delay within their outage budget (`trainer.services.outage_budget_s`), not a restart."""
    health_timeout: float = Field(120.0, gt=0)
    """Seconds a service gets to report SERVING after it starts."""
    stop_grace: float = Field(60.0, gt=0)
    """Seconds each stage gets to exit after SIGTERM (trainers checkpoint in it) before SIGKILL."""
    serve_after: bool = False
    """Keep SEE (REST) and the others running after the trainers finish, until Ctrl-C."""
    status_every: float = Field(1.0, gt=0)
    """Seconds between refreshes of the live status table."""
    worker_slots: int | None = Field(None, ge=1)
    """CPU threads this machine offers MWRA as the run's local worker (None: os.cpu_count());
    `up` registers the worker and keeps its lease alive while the run lasts."""
    warm_start: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Per policy name: SFTConfig fields (`mutualrl sft`) for a warm start made before RL when
    its checkpoint does not exist yet; the policy then trains from that checkpoint."""
