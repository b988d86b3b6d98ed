"""configs/gsm8k-chat-cpu.yaml through `mutualrl up` with real SEE, THL and MWRA: two tiny
policies of two families whose tokenizers carry two different chat templates, a parquet table
under its own column names, math-verify plus a reward function from a Python file, SGT, and a
benchmark at n=4 reported as avg@4 and pass@4 per policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from chat_policies import chat_policy, write_problems
from tiny_up import run_up

pytestmark = [pytest.mark.slow, pytest.mark.timeout(960)]
ROOT = Path(__file__).resolve().parents[2]


def test_gsm8k_chat_cpu_twin_through_up(tmp_path: Path) -> None:
    cfg = yaml.safe_load((ROOT / "configs/gsm8k-chat-cpu.yaml").read_text())
    tr = cfg["trainer"]
    tr["output_dir"] = str(tmp_path / "runs")
    tr["task"]["dataset"]["path"] = str(write_problems(tmp_path / "train.parquet", 40))
    bench = tr["eval"]["benchmarks"][0]
    bench["path"] = str(write_problems(tmp_path / "test.parquet", 6, start=6))
    rewards = tr["task"]["rewards"]
    rewards[1]["fn"] = str(ROOT / rewards[1]["fn"])
    presets = tmp_path / "runs" / "presets"
    for policy, preset in zip(tr["policies"], ("gpt2-bpe", "llama-char"), strict=True):
        policy["model_path"] = str(chat_policy(preset, presets, tmp_path / policy["name"]))
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))

    run_dir = tmp_path / "runs" / tr["run_id"]
    summary, console = run_up(path, run_dir, timeout=900)
    results = summary["results"]
    assert set(results) == {"gpt2-chatml", "llama-llama3"}
    matrix = summary["see_stats"]["matrix"]
    for name, peer in (("gpt2-chatml", "llama-llama3"), ("llama-llama3", "gpt2-chatml")):
        res = results[name]
        # every round published its records, and each policy took its peer's: SGT's reads of
        # the reward statistics of the prompts it failed
        assert res["publish_failed_rounds"] == 0, res
        assert res["records_published"] >= 3 * 4 * (4 + 1), res
        assert res["records_taken"] > 0, res
        assert matrix["REWARD_STATS"][name][peer] > 0, matrix
        print(f"{name}: records published {res['records_published']}, taken "
              f"{res['records_taken']}, {matrix['REWARD_STATS'][name][peer]} from {peer}")
    for name, res in results.items():
        final = res["benchmarks"]["additions"]["final"]
        assert final["problems"] == 6.0
        assert 0.0 <= final["avg@4"] <= final["pass@4"] <= 1.0, (name, final)
        assert final["pass@1"] == pytest.approx(final["avg@4"])
        start = res["benchmarks"]["additions"]["start"]  # evaluated before the first update
        assert start["problems"] == 6.0 and 0.0 <= start["avg@4"] <= start["pass@4"] <= 1.0
        assert res["benchmarks"]["additions"]["curve"][0]["round"] == 0
        skills = res["benchmarks"]["additions"]["skills"]
        assert set(skills) == {"small", "large"}  # 6+0 .. 6+5: sums below 10 and from 10
        assert all(s["pass@4"] >= s["avg@4"] for s in skills.values())
        rows = [json.loads(x) for x in (run_dir / name / "metrics.jsonl").read_text()
                .splitlines()]
        assert [r["round"] for r in rows] == [0, 1, 2]
        for r in rows:  # both reward functions scored every round, neither failed
            assert r["publish_failed"] == 0.0
            assert 0.0 <= r["reward/math_verify"] <= 1.0
            assert 0.0 <= r["reward/concise"] <= 1.0
            assert r["reward_errors/math_verify"] == 0.0 and r["reward_errors/concise"] == 0.0
            assert r["data/dropped_overlong"] == 0.0
        assert "rescued_prompts" in rows[-1]  # SGT ran
    assert "| start | final |" in (run_dir / "results.md").read_text()
    assert "start → final" in console
