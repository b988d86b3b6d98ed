"""Runner helpers that need no trainer: warm-start checks (the per-run clean-up is DeleteRun,
tests/integration/test_delete_run.py)."""

from __future__ import annotations

import json
from pathlib import Path

from mutualrl.experiment.plan import WarmStart
from mutualrl.experiment.runner import warm_start_report


def test_warm_start_report_flags_leaky_weak_and_unlearned_strong_skills(tmp_path: Path) -> None:
    (tmp_path / "sft_eval.json").write_text(json.dumps({
        "heldout_accuracy": {"add": 0.19, "sub": 0.01, "rev": 0.97, "sort": 0.27, "mean": 0.36},
        "strong_skills": ["add", "rev"], "weak_skills": ["sub", "sort"], "steps": 10,
        "train_seconds": 1.0}))
    w = WarmStart("short", "A", 0, {}, tmp_path)
    rep = warm_start_report(w, weak_max=0.05, strong_min=0.5)
    assert rep["heldout_accuracy"]["rev"] == 0.97
    assert rep["flags"] == ["strong add only 0.19 (< 0.5)", "weak sort starts at 0.27 (> 0.05)"]
    assert warm_start_report(w, weak_max=0.5, strong_min=0.1)["flags"] == []
