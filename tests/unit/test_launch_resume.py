"""What makes a second `mutualrl up` of a run another run (refused, naming `--fresh`), and what
`--fresh` deletes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mutualrl.launch.resume import (
    ResumeRefused,
    check_resumable,
    identity_changes,
    prior_run,
    running_up,
    wipe,
)
from mutualrl.trainer.config.run import TrainerConfig


def _cfg(**trainer: Any) -> TrainerConfig:
    base: dict[str, Any] = {"run_id": "r", "policies": [{"name": "a", "preset": "gpt2-bpe"},
                                                        {"name": "b", "preset": "llama-char"}]}
    return TrainerConfig.model_validate({**base, **trainer})


def test_what_a_resumed_run_must_keep() -> None:
    before = _cfg()
    assert identity_changes(before, _cfg()) == []
    # Training knobs may change between runs of the same run: lr, rounds, probe, eval.
    assert identity_changes(before, _cfg(grpo={"lr": 1e-5, "rounds": 9},
                                         probe={"kind": "prp"}, eval={"every": 2})) == []
    assert identity_changes(before, _cfg(seed=3)) == ["trainer.seed: 0 -> 3"]
    assert identity_changes(before, _cfg(grpo={"group_size": 4})) == \
        ["trainer.grpo.group_size: 8 -> 4"]
    changed = identity_changes(before, _cfg(
        task={"regime": "worked"}, policies=[{"name": "a", "preset": "qwen2-unigram"},
                                             {"name": "b", "preset": "llama-char"}]))
    assert changed[0].startswith("trainer.task: ")
    assert changed[1] == 'trainer.policies[0].preset (a): "gpt2-bpe" -> "qwen2-unigram"'
    # A policy new to the run has no state to disagree with.
    assert identity_changes(before, _cfg(policies=[
        {"name": "a", "preset": "gpt2-bpe"}, {"name": "c", "preset": "qwen2-unigram"}])) == []


def test_a_warm_start_path_up_sets_is_not_a_change(tmp_path: Path) -> None:
    before = _cfg(policies=[{"name": "a", "preset": "gpt2-bpe",
                             "sft_checkpoint": str(tmp_path / "w")}])
    now = _cfg(policies=[{"name": "a", "preset": "gpt2-bpe"}])
    assert identity_changes(before, now, warm_started={"a"}) == []
    assert identity_changes(before, now) != []
    (tmp_path / "run.yaml").write_text(json.dumps({"trainer": before.model_dump(mode="json")}))
    with pytest.raises(ResumeRefused, match=r"policies\[0\].sft_checkpoint.*--fresh"):
        check_resumable(tmp_path / "run.yaml", now, Path("run.yaml"))
    check_resumable(tmp_path / "run.yaml", now, Path("run.yaml"), warm_started={"a"})


def test_prior_state_and_fresh(tmp_path: Path) -> None:
    run = tmp_path / "r"
    for name in ("a/checkpoints/round-000002", "a/checkpoints/round-000004", "warm_start/a",
                 "logs", "redis", "b"):
        (run / name).mkdir(parents=True)
    (run / "a" / "metrics.jsonl").write_text('{"round": 0}\n{"round": 1}\n')
    (run / "results.json").write_text("{}")
    prior = prior_run(_cfg(output_dir=str(tmp_path)), run)
    assert (prior.rounds, prior.logged, prior.resumes) == ({"a": 4, "b": 0}, {"a": 2, "b": 0},
                                                            True)
    assert prior.describe() == "a from round 4, b from round 0"
    assert wipe(run) == ["a", "b", "redis", "results.json"]
    assert sorted(p.name for p in run.iterdir()) == ["logs", "warm_start"]
    assert not prior_run(_cfg(output_dir=str(tmp_path)), run).resumes


def test_a_run_whose_up_still_runs_is_seen(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                              "mutualrl-trainer"])
    cmdline = Path(f"/proc/{child.pid}/cmdline")
    deadline = time.monotonic() + 10
    while b"mutualrl" not in cmdline.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.01)  # until it has exec'd
    try:
        state = {"stopped": False, "pids": {"trainer-a": child.pid}}
        (tmp_path / "up.json").write_text(json.dumps(state))
        assert running_up(tmp_path) == child.pid
        (tmp_path / "up.json").write_text(json.dumps({**state, "stopped": True}))
        assert running_up(tmp_path) is None
    finally:
        child.kill()
        child.wait()
    (tmp_path / "up.json").write_text(json.dumps({"stopped": False,
                                                  "pids": {"trainer-a": child.pid}}))
    assert running_up(tmp_path) is None  # that `up` died; its children with it


def test_a_policy_across_nodes_is_one_gang_of_launchers(tmp_path: Path) -> None:
    from mutualrl.launch.supervisor import Restart
    from mutualrl.launch.up import trainer_specs

    [one] = trainer_specs("a", 1, tmp_path / "run.yaml", tmp_path, {}, Restart.NEVER, 0)
    assert one.name == "trainer-a" and one.gang is None and "--node-rank" not in one.argv
    specs = trainer_specs("b", 3, tmp_path / "run.yaml", tmp_path, {"X": "1"},
                          Restart.ON_FAILURE, 2)
    assert [s.name for s in specs] == ["trainer-b", "trainer-b-node1", "trainer-b-node2"]
    assert {s.gang for s in specs} == {"trainer-b"}
    assert [s.argv[s.argv.index("--node-rank") + 1] for s in specs] == ["0", "1", "2"]
    endpoints = {s.argv[s.argv.index("--rdzv-endpoint") + 1] for s in specs}
    assert len(endpoints) == 1 and next(iter(endpoints)).startswith("127.0.0.1:")
    assert [s.log_path.name for s in specs] == [f"{s.name}.log" for s in specs]
    assert all(s.finishes and s.max_restarts == 2 and s.env == {"X": "1"} for s in specs)
