"""README's "Train your own checkpoints" example, as printed, through `mutualrl up` with the
run's secret set and the deterministic exchange: two policies of two families with their own
chat templates, a GSM8K-style parquet table, math-verify plus README's own reward function
(weighted), SGT. Records cross both ways, every round publishes, and the results say so.

The test reads the YAML block and the Python block of README's section and changes only what
a CPU test must (`MACHINE`, below, names every change): paths to the tables, the reward file
and the tiny chat policies this test writes; devices and dtypes; sizes and rounds; the fields
the done-when check adds (the deterministic mode, `up`'s supervision). Everything else runs as
printed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from chat_policies import CHATML, LLAMA3, chat_policy

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
SECRET = "readme-secret-3a9"


def readme_blocks() -> tuple[str, str]:
    """The YAML and the Python block of README's "Train your own checkpoints" section."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Train your own checkpoints", 1)[1].split("\n## ", 1)[0]
    yaml_block = re.search(r"```yaml\n(.*?)```", section, re.S)
    py_block = re.search(r"```python\n(.*?)```", section, re.S)
    assert yaml_block and py_block, "README's section lost its YAML or Python block"
    return yaml_block.group(1), py_block.group(1)


def write_gsm8k(path: Path, rows: list[tuple[int, int]]) -> Path:
    """GSM8K's columns: `question`, and `answer` ending with `#### <number>`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({
        "question": [f"{a}+{b}?" for a, b in rows],
        "answer": [f"{a} + {b} = {a + b}.\n#### {a + b}" for a, b in rows]}), path)
    return path


def machine(cfg: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """MACHINE: every change to README's example, and nothing else."""
    tr = cfg["trainer"]
    rows = [(a, b) for a in range(1, 10) for b in range(1, 10)]
    reward_file = tmp / "my_rewards.py"
    reward_file.write_text(readme_blocks()[1])
    # paths: this test's tables, reward file and run directory
    tr["output_dir"] = str(tmp / "runs")
    tr["task"]["dataset"]["path"] = str(write_gsm8k(tmp / "train.parquet", rows[:24]))
    tr["eval"]["benchmarks"][0]["path"] = str(write_gsm8k(tmp / "test.parquet", rows[-3:]))
    assert tr["task"]["rewards"][1]["fn"] == "my_rewards.py:concise"
    tr["task"]["rewards"][1]["fn"] = f"{reward_file}:concise"
    # models: tiny policies of two families with the chat templates of the named checkpoints,
    # on the CPU in float32
    presets = tmp / "runs" / "presets"
    for policy, (preset, template) in zip(tr["policies"], (("qwen2-unigram", CHATML),
                                                           ("llama-char", LLAMA3)), strict=True):
        policy["model_path"] = str(chat_policy(preset, presets, tmp / policy["name"], template))
        policy["device"], policy["compute_dtype"] = "cpu", "float32"
    # sizes and rounds: what two cores run in a minute (and the tiny models' 128 positions)
    tr["grpo"].update(group_size=4, prompts_per_round=4, rounds=3)
    tr["task"]["max_new_tokens"] = 6
    tr["eval"]["benchmarks"][0]["n"] = 2
    # the done-when check: the deterministic exchange (every round reads its peers' records)
    tr["exchange"] = {"mode": "deterministic"}
    cfg["up"] = {"restart": "never", "health_timeout": 120, "stop_grace": 60,
                 "status_every": 0.5}
    return cfg


def test_readme_example_shares_both_ways_with_the_secret_set(tmp_path: Path) -> None:
    printed = yaml.safe_load(readme_blocks()[0])
    assert set(printed) == {"trainer"}
    cfg = machine(json.loads(json.dumps(printed)), tmp_path)
    tr = cfg["trainer"]
    # What the example is about stays as printed.
    assert len(tr["task"]["rewards"]) >= 2 and tr["task"]["rewards"][1]["weight"] == 0.1
    assert tr["task"]["success_reward"] == "math_verify" and tr["probe"]["kind"] == "sgt"
    assert tr["policies"][1]["chat_template_kwargs"] == {"date_string": "01 Jan 2025"}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))

    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # private redis-server
    env["MUTUALRL_AUTH_TOKEN"] = SECRET
    proc = subprocess.run([sys.executable, "-m", "mutualrl.cli", "up", "-c", str(path)],
                          capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    run_dir = tmp_path / "runs" / tr["run_id"]
    summary = json.loads((run_dir / "results.json").read_text())
    assert summary["status"] == "finished" and summary["failure"] is None
    results = summary["results"]
    names = [p["name"] for p in tr["policies"]]
    assert set(results) == set(names)
    matrix = summary["see_stats"]["matrix"]
    for name, peer in zip(names, reversed(names), strict=True):
        res = results[name]
        # every round published its records (a ROLLOUT per sample, REWARD_STATS per prompt)
        assert res["publish_failed_rounds"] == 0
        assert res["records_published"] >= 3 * 4 * (4 + 1), res
        # and the peer's crossed: SGT's reads took the peer's reward statistics every round
        assert res["records_taken"] > 0, res
        # (staleness 1: rounds 1 and 2 read the peer's rounds 0 and 1, 4 prompts each)
        assert matrix["REWARD_STATS"][name][peer] >= 2 * 4, matrix
        rows = [json.loads(x) for x in (run_dir / name / "metrics.jsonl").read_text()
                .splitlines()]
        assert [r["round"] for r in rows] == [0, 1, 2]
        for r in rows:  # both reward functions scored every round, and the publish went out
            assert r["publish_failed"] == 0.0
            assert 0.0 <= r["reward/math_verify"] <= 1.0
            assert r["reward_errors/math_verify"] == 0.0 and r["reward_errors/concise"] == 0.0
            assert "rescued_prompts" in r or r["round"] == 0  # SGT read the peer's round
    assert "records published" in (run_dir / "results.md").read_text()
