"""A user's own experiment on one trainer alone (no services): chat-templated policies on a
parquet table with a benchmark train, evaluate and resume at their epoch position, and each
kind of bad input stops `mutualrl train` before round 0 with an error naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from chat_policies import chat_policy, write_problems

from mutualrl.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("exp")
    table = write_problems(root / "t.parquet", 24)
    return {"trainer": {
        "run_id": "exp", "output_dir": str(root / "runs"),
        "task": {"dataset": {"path": str(table), "prompt_key": "query", "answer_key": "gold",
                             "skill_key": "kind"},
                 "rewards": [{"fn": "math_verify"}], "max_new_tokens": 4},
        "grpo": {"group_size": 2, "prompts_per_round": 4, "rounds": 2},
        "eval": {"every": 2, "benchmarks": [{"name": "b", "path": str(table), "split": "test",
                                             "n": 2, "limit": 12,
                                             "from_task": ["prompt_key", "answer_key",
                                                           "skill_key"]}]},
        "checkpoint": {"every": 1},
        "metrics": {"tensorboard": False, "progress": False},
        "services": {"local": True},
        "policies": [{"name": "llama", "model_path": str(chat_policy(
            "llama-char", root / "presets", root / "llama"))}]}}


def _write(tmp_path: Path, cfg: dict[str, Any], **task: Any) -> Path:
    cfg = json.loads(json.dumps(cfg))
    cfg["trainer"]["output_dir"] = str(tmp_path / "runs")
    cfg["trainer"]["task"].update(task)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_trains_evaluates_and_resumes_at_its_epoch_position(base: dict[str, Any],
                                                            tmp_path: Path) -> None:
    path = _write(tmp_path, base)
    assert main(["train", "-c", str(path), "--policy", "llama", "--rounds", "1"]) == 0
    run = tmp_path / "runs" / "exp" / "llama"
    ckpts = sorted((run / "checkpoints").iterdir())
    assert ckpts, "no checkpoint"
    from mutualrl.trainer.runtime import checkpoint

    state = torch.load(ckpts[-1] / checkpoint.RESUME_FILE, weights_only=True)
    assert state["data"] == {"epoch": 0, "index": 4, "problems": 24, "seed": 0,
                             "prompts_per_round": 4}
    assert main(["train", "-c", str(path), "--policy", "llama", "--resume"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1]
    last = rows[-1]
    assert 0.0 <= last["bench/b/avg@2"] <= last["bench/b/pass@2"] <= 1.0
    assert "bench/b/small/avg@2" in last and last["reward_errors/math_verify"] == 0.0
    out = tmp_path / "eval.json"
    assert main(["eval", "-c", str(path), "--policy", "llama", "--latest", "--out",
                 str(out)]) == 0
    figures = json.loads(out.read_text())["benchmarks"]["b"]
    assert figures["bench/b/problems"] == 12.0 and "bench/b/pass@2" in figures


@pytest.mark.parametrize(("task", "policy", "message"), [
    ({"dataset": {"path": "/nonexistent/train.parquet"}}, {},
     r"task.dataset.path: /nonexistent/train.parquet does not exist"),
    ({"dataset": {"prompt_key": "question"}}, {},
     r"task.dataset.prompt_key: no column 'question' .* \['query', 'gold', 'kind'\]"),
    ({"rewards": [{"fn": "no_such_rewards_module:score"}]}, {},
     r"task.rewards\[score\].fn: cannot import 'no_such_rewards_module'"),
    ({"rewards": [{"fn": "REWARDS:one_value"}]}, {},
     r"task.rewards\[one_value\]: returned 1 values for 2 completions"),
    ({"system": "Answer with the sum. " * 12}, {},
     r"policies\[llama\]: problem '.*' renders to \d+ tokens, which with task.max_new_tokens 4 "
     r"makes \d+, past the model's context of 256 tokens \(max_position_embeddings in "
     r".*llama/config.json\)"),
    ({}, {"chat_template": "TEMPLATE"},
     r"policies\[llama\]: the chat template \(policies\[llama\].chat_template .*t\.jinja\) "
     r"does not render"),
])
def test_bad_input_stops_before_round_0_naming_the_field(
        base: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        task: dict[str, Any], policy: dict[str, Any], message: str) -> None:
    rewards = tmp_path / "rewards.py"
    rewards.write_text("def one_value(completions, **kw):\n    return [1.0]\n")
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages[0]['content'] | no_such_filter }}")
    task = json.loads(json.dumps(task).replace("REWARDS", str(rewards)))
    if "dataset" in task:
        task["dataset"] = {**base["trainer"]["task"]["dataset"], **task["dataset"]}
    cfg = json.loads(json.dumps(base))
    cfg["trainer"]["policies"][0].update(
        {k: str(template) if v == "TEMPLATE" else v for k, v in policy.items()})
    path = _write(tmp_path, cfg, **task)
    assert main(["train", "-c", str(path), "--policy", "llama"]) == 2
    import re

    assert re.search(message, capsys.readouterr().err), message
    assert not (tmp_path / "runs" / "exp" / "llama" / "metrics.jsonl").exists()


def test_a_restart_without_a_checkpoint_logs_each_round_once(base: dict[str, Any],
                                                             tmp_path: Path) -> None:
    """A trainer restarted with `--resume` and no checkpoint to resume from (it died before
    its first) runs from round 0 again: metrics.jsonl holds each round once."""
    import shutil

    path = _write(tmp_path, base)
    assert main(["train", "-c", str(path), "--policy", "llama", "--rounds", "1"]) == 0
    run = tmp_path / "runs" / "exp" / "llama"
    shutil.rmtree(run / "checkpoints")
    assert main(["train", "-c", str(path), "--policy", "llama", "--resume"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1]
