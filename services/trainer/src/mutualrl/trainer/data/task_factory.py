"""The task a run's `task:` section describes."""

from __future__ import annotations

from mutualrl.trainer.config.task import DatasetTaskConfig, JsonlTaskConfig, TaskConfig
from mutualrl.trainer.data.dataset_task import DatasetTask
from mutualrl.trainer.data.jsonl import JsonlTask
from mutualrl.trainer.data.tasks import SyntheticTask, Task


def make_task(cfg: TaskConfig | JsonlTaskConfig | DatasetTaskConfig) -> Task:
    """Synthetic (`TaskConfig`), a JSONL dataset, or a local table with reward functions."""
    if isinstance(cfg, DatasetTaskConfig):
        return DatasetTask(cfg)
    if isinstance(cfg, JsonlTaskConfig):
        return JsonlTask(cfg)
    return SyntheticTask(cfg)
