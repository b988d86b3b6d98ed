"""Runner helpers that need no trainer: warm-start checks (the per-run clean-up is DeleteRun,
tests/integration/test_delete_run.py)."""

from __future__ import annotations

import json
from pathlib import Path

from mutualrl.experiment.plan import RunSpec, WarmStart
from mutualrl.experiment.runner import (
    experiment_tokenizer_roots,
    lock_out_dir,
    warm_start_report,
)


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


def _run(regime: str, policies: list[dict[str, str]]) -> RunSpec:
    return RunSpec(regime=regime, probe="sgt", seed=0, run_id=f"x-{regime}", policies=[],
                   rounds=1, trainer={"output_dir": "ignored", "policies": policies}, warm={},
                   eta_s=1.0)


def test_one_thl_may_read_the_tokenizers_of_every_run_of_the_experiment(tmp_path: Path) -> None:
    """THL serves all runs: its roots hold the experiment's directory (warm starts, run dirs)
    and the checkpoints of the policies of every regime, not only the first run's."""
    out = tmp_path / "exp"
    runs = [_run("short", [{"name": "A", "model_path": str(tmp_path / "ckpt-a")}]),
            _run("short3", [{"name": "C", "sft_checkpoint": str(tmp_path / "elsewhere" / "c")}])]
    roots = experiment_tokenizer_roots({"tokenizer_roots": ["/srv/tok"]}, out, runs)
    assert roots == [str(out.resolve()), "/srv/tok", str((tmp_path / "ckpt-a").resolve()),
                     str((tmp_path / "elsewhere" / "c").resolve())]
    default = experiment_tokenizer_roots({}, out, runs[:1])
    assert default[0] == str(out.resolve()) and "runs" in default


def test_one_invocation_per_out_dir(tmp_path: Path) -> None:
    """A second invocation on the same --out is refused while the first holds it (they would
    share the private Redis's data directory), and allowed once the first ends."""
    first = lock_out_dir(tmp_path)
    assert first is not None
    assert lock_out_dir(tmp_path) is None
    other = tmp_path / "other"
    other.mkdir()
    second = lock_out_dir(other)
    assert second is not None
    first.close()
    again = lock_out_dir(tmp_path)
    assert again is not None
    again.close()
    second.close()
