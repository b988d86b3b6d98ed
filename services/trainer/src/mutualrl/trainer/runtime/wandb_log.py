"""Weights & Biases as one more sink of the trainer's round metrics (`metrics.wandb`).

One W&B run per policy, named after it and grouped by the MutualRL run id, so a run's policies
sit side by side as TRL's and verl's `report_to: wandb` runs do. Its id is kept in the policy's
run directory: a resumed trainer (`--resume`) continues the same W&B run.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from mutualrl.trainer.config.run import WandbSettings


class WandbSink:
    def __init__(self, settings: WandbSettings, out_dir: Path, run_id: str, policy: str,
                 config: dict[str, Any] | None = None) -> None:
        try:
            import wandb
        except ImportError as err:  # an optional extra
            raise RuntimeError("metrics.wandb is set but wandb is not installed: "
                               "pip install 'mutualrl-trainer[wandb]'") from err
        id_file = out_dir / "wandb_id"
        run_key = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
        id_file.write_text(run_key)
        self.run = wandb.init(
            project=settings.project, entity=settings.entity, mode=settings.mode,
            group=settings.group or run_id, name=policy, id=run_key, resume="allow",
            tags=list(settings.tags), dir=str(out_dir), config=config or {},
            job_type="train", reinit="create_new")

    def log(self, round_k: int, values: dict[str, float]) -> None:
        # W&B steps only go forward: rounds a resumed trainer runs again are dropped by W&B
        # (metrics.jsonl and SEE keep the rerun's rows).
        self.run.log(values, step=round_k)

    def close(self) -> None:
        self.run.finish()
