"""A benchmark of its own data beside policies of unequal contexts, through `mutualrl up`: a
JSONL benchmark with its own columns (`problem`, `solution`) and answer form (GSM8K's
`#### x`), next to a training table of other columns with a skill column; a policy of 256
tokens of context (characters, `max_prompt_tokens: 200`) beside one of 8192 (unigram pieces).
The benchmark's two problems longer than 256 characters, which the first policy cannot take,
are dropped for both policies; the run trains, scores both on the same four problems and
reports the two dropped; `mutualrl train --dry-run` prints, under each policy's plan, the
benchmark settings it will use."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from chat_policies import write_problems
from tiny_up import metrics_rows, run_up, up_config, write_yaml

pytestmark = [pytest.mark.slow, pytest.mark.timeout(960)]

SHORT = [(3, 4), (8, 5), (2, 9), (6, 6)]
LONG = 2


def _benchmark(path: Path) -> Path:
    """Four short sums and two long ones (over 256 characters), GSM8K-style solutions."""
    rows = [{"problem": f"add:{a}+{b}=", "solution": f"{a} + {b} = {a + b}\n#### {a + b}"}
            for a, b in SHORT]
    rows += [{"problem": "Add the numbers and give the sum only: " + "+".join(["1"] * (120 + i))
              + "=", "solution": f"#### {120 + i}"} for i in range(LONG)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _policy(preset: str, cache: Path, out: Path, context: int) -> Path:
    """A copy of `preset` whose config gives the model `context` positions (rotary: no
    weights depend on it)."""
    from mutualrl.trainer.runtime.presets import ensure_preset

    shutil.copytree(ensure_preset(preset, cache), out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["max_position_embeddings"] = context
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def test_a_benchmark_of_its_own_columns_beside_a_256_token_policy(tmp_path: Path) -> None:
    """Catches a benchmark that inherits the task's columns, answer form or skill column
    (planted: `BenchmarkSettings.dataset` merging `task.dataset`'s fields: the dry run cannot
    read the benchmark, "eval.benchmarks[own].skill_key: no column 'kind'", and prints no
    benchmark line), a long benchmark problem that stops the run or is kept
    for one policy (planted: `benchmark_tasks` without its drop: the dry run exits 2, "problem
    ... renders to 281 tokens, which with grpo.max_new_tokens 6 makes 287, past the model's
    context of 256 tokens"), and a drop the results and the dry run do not report."""
    presets = tmp_path / "presets"
    cfg = up_config(tmp_path, "bench-data", rounds=2)
    tr = cfg["trainer"]
    tr["task"] = {"dataset": {"path": str(write_problems(tmp_path / "train.parquet", 16)),
                              "prompt_key": "query", "answer_key": "gold", "skill_key": "kind"},
                  "rewards": [{"fn": "math_verify"}], "max_new_tokens": 6}
    tr["eval"] = {"every": 2, "benchmarks": [{
        "name": "own", "path": str(_benchmark(tmp_path / "own.jsonl")), "split": "train",
        "prompt_key": "problem", "answer_key": "solution", "answer_form": "gsm8k", "n": 2}]}
    tr["policies"] = [
        {"name": "short", "model_path": str(_policy("llama-char", presets, tmp_path / "short",
                                                    256)), "max_prompt_tokens": 200},
        {"name": "long", "model_path": str(_policy("qwen2-unigram", presets, tmp_path / "long",
                                                   8192))}]
    path = write_yaml(tmp_path / "run.yaml", cfg)

    dry = subprocess.run([sys.executable, "-m", "mutualrl.cli", "train", "-c", str(path),
                          "--dry-run"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    line = (f"benchmark own: {tmp_path / 'own.jsonl'} (split train): prompt_key=problem, "
            "answer_key=solution, answer_form=gsm8k; from task.dataset: nothing; 4 problems "
            "scored, 2 dropped as longer than a policy's limit; n=2, max_new_tokens=6, "
            "temperature=1")
    plans = dry.stdout.split("policy ")
    for policy in ("short", "long"):  # under each policy's plan
        plan = next(p for p in plans if p.startswith(f"{policy}:"))
        assert line in plan, dry.stdout

    run_dir = tmp_path / "runs" / "bench-data"
    summary, console = run_up(path, run_dir, timeout=600)
    assert summary["status"] == "finished", summary["failure"]
    for policy in ("short", "long"):
        rows = metrics_rows(run_dir, policy)
        assert [r["round"] for r in rows] == [0, 1]
        final = summary["results"][policy]["benchmarks"]["own"]["final"]
        assert (final["problems"], final["dropped_overlong"]) == (4.0, 2.0), final
        assert "avg@2" in final and "pass@2" in final
        assert rows[0]["start/bench/own/problems"] == 4.0  # the evaluation before round 0
        # the benchmark has no skill column of its own: no per-skill figures
        assert summary["results"][policy]["benchmarks"]["own"]["skills"] == {}
    assert "| own | 4 | 2 |" in (run_dir / "results.md").read_text()
    assert "own: 4 problems scored, 2 dropped as longer than a policy's limit" in \
        " ".join(console.split())
