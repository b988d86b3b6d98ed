"""The evaluation before the first update: a dataset task with a benchmark logs its start
figures with round 0, and a resumed run does not evaluate the start again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from chat_policies import chat_policy, write_problems

from mutualrl.trainer.config.run import TrainerConfig
from mutualrl.trainer.runtime.loop import train
from mutualrl.trainer.runtime.session import build_session

pytestmark = pytest.mark.timeout(300)


def _config(tmp_path: Path, rounds: int) -> TrainerConfig:
    presets = tmp_path / "presets"
    return TrainerConfig.model_validate({
        "run_id": "round0-eval", "output_dir": str(tmp_path / "runs"),
        "task": {"dataset": {"path": str(write_problems(tmp_path / "train.parquet", 20)),
                             "prompt_key": "query", "answer_key": "gold", "skill_key": "kind"},
                 "rewards": [{"fn": "math_verify"}], "max_new_tokens": 4},
        "grpo": {"group_size": 2, "prompts_per_round": 2, "rounds": rounds},
        "probe": {"kind": "none"},
        "eval": {"every": 1, "benchmarks": [
            {"name": "additions", "path": str(write_problems(tmp_path / "test.parquet", 4,
                                                             start=6)),
             "split": "test", "n": 2, "temperature": 1.0, "prompt_key": "query",
             "answer_key": "gold", "skill_key": "kind"}]},
        "checkpoint": {"every": 1},
        "metrics": {"tensorboard": False, "progress": False, "see": False},
        "services": {"local": True},
        "policies": [{"name": "p", "model_path": str(chat_policy(
            "gpt2-bpe", presets, tmp_path / "gpt2-chatml")), "max_prompt_tokens": 128}],
    })


def _rows(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "runs" / "round0-eval" / "p" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_start_figures_with_round_0_and_not_again_on_resume(tmp_path: Path) -> None:
    s = build_session(_config(tmp_path, rounds=1), "p", cache_dir=tmp_path / "presets")
    try:
        train(s)
    finally:
        s.close()
    (r0,) = _rows(tmp_path)
    start = {k: v for k, v in r0.items() if k.startswith("start/")}
    # the benchmark before any update, beside the one after round 0
    for key in ("bench/additions/avg@2", "bench/additions/pass@2", "bench/additions/problems"):
        assert isinstance(start[f"start/{key}"], float) and isinstance(r0[key], float), key
    assert start["start/bench/additions/problems"] == 4.0
    assert 0.0 <= start["start/bench/additions/avg@2"] <= start["start/bench/additions/pass@2"]
    assert start["start/bench/additions/pass@2"] <= 1.0

    s = build_session(_config(tmp_path, rounds=2), "p", resume=True,
                      cache_dir=tmp_path / "presets")
    try:
        assert s.start_round == 1
        train(s)
    finally:
        s.close()
    rows = _rows(tmp_path)
    assert [r["round"] for r in rows] == [0, 1]
    assert rows[0] == r0  # round 0's row, start figures and all, as it was
    assert not any(k.startswith("start/") for k in rows[1])  # not evaluated again
    assert "bench/additions/avg@2" in rows[1]
