"""What `mutualrl up` starts (`LaunchPlan`): the processes and where each writes, shared by the
launcher (`up.py`) and what it shows (`report.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mutualrl.launch.config import UpConfig
from mutualrl.launch.resume import PriorRun
from mutualrl.launch.supervisor import ProcessSpec


@dataclass
class LaunchPlan:
    """Everything `up` starts, derived from the run YAML."""

    run_dir: Path
    config_path: Path
    """The effective run YAML (ports and addresses filled in) every child reads."""
    up: UpConfig
    run_id: str
    policies: list[str]
    metrics_files: dict[str, Path]
    rounds: int
    secret: str | None = None
    """The run's secret (auth on): trainers get policy tokens derived from it, `up` creates
    the run with it. Kept out of the effective YAML, which trainers read."""
    endpoints: dict[str, str] = field(default_factory=dict)
    specs: list[ProcessSpec] = field(default_factory=list)
    warm_start: list[ProcessSpec] = field(default_factory=list)
    prior: PriorRun | None = None
    """The state an earlier `up` left, which this one resumes (None: a new run)."""
    fresh: bool = False
    """`--fresh`: the run is deleted in the services before the trainers start."""
    source_path: Path | None = None
    """The run file the user gave `up` (`config_path` is the effective one `up` writes)."""

    @property
    def fresh_command(self) -> str:
        """The command that starts this run again from round 0, on the user's run file."""
        return f"mutualrl up -c {self.source_path or self.config_path} --fresh"
