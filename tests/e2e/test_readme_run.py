"""README's "Train your own checkpoints" example, as printed, through `mutualrl up` with the
run's secret set, in the mode it prints (the asynchronous exchange) and in the deterministic
one: two policies of two families with their own
chat templates, a GSM8K-style parquet table, math-verify plus README's own reward function
(weighted), SGT. Records cross both ways, every round publishes, SGT rescues prompts both ways
with the peer's verified successes, and the results say so.

The test reads the YAML block and the Python block of README's section and changes only what
a CPU test must (`MACHINE`, below, names every change): paths to the tables, the reward file
and the tiny chat policies this test writes; devices and dtypes; sizes and rounds; the fields
the done-when check adds (the deterministic mode in one test, `up`'s supervision). Everything
else runs as printed.

The policies are complementary, as SGT needs: each is warm-started (on the prompts the run
renders, README's system prompt in its own chat template) to answer its own half of the
table's eight problems, and fails the other half, which its peer solves."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from chat_policies import CHATML, LLAMA3, chat_policy
from tiny_up import metrics_rows, run_up
from warm_start import warm_on_table

# A first run warm-starts the two policies (~40 s on one free core, minutes on a loaded one;
# cached after) before `up` runs within its own 600 s
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[2]
SECRET = "readme-secret-3a9"
# The training table: eight problems with eight different sums (a policy that does not know a
# problem cannot answer it with an answer it learned for another), half known to each policy.
# Eight problems are rounds 0 and 1 of four prompts, the rounds SGT reads in three.
ROWS = [(3, 4), (8, 5), (2, 9), (6, 6), (1, 4), (9, 7), (5, 3), (7, 8)]
KNOWN = {"qwen": ROWS[:4], "llama": ROWS[4:]}


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
        "question": [question(a, b) for a, b in rows],
        "answer": [f"{a} + {b} = {a + b}.\n#### {a + b}" for a, b in rows]}), path)
    return path


def question(a: int, b: int) -> str:
    return f"{a}+{b}?"


def machine(cfg: dict[str, Any], tmp: Path, warm_cache: Path,
            deterministic: bool = True) -> dict[str, Any]:
    """MACHINE: every change to README's example, and nothing else (`deterministic`: the
    done-when check's exchange mode; False keeps the printed default, asynchronous)."""
    from mutualrl.trainer.config.run import TrainerConfig

    tr = cfg["trainer"]
    rows = [(a, b) for a in range(1, 10) for b in range(1, 10)]
    reward_file = tmp / "my_rewards.py"
    reward_file.write_text(readme_blocks()[1])
    # paths: this test's tables, reward file and run directory
    tr["output_dir"] = str(tmp / "runs")
    tr["task"]["dataset"]["path"] = str(write_gsm8k(tmp / "train.parquet", ROWS))
    tr["eval"]["benchmarks"][0]["path"] = str(write_gsm8k(tmp / "test.parquet", rows[-3:]))
    assert tr["task"]["rewards"][1]["fn"] == "my_rewards.py:concise"
    tr["task"]["rewards"][1]["fn"] = f"{reward_file}:concise"
    # models: tiny policies of two families with the chat templates of the named checkpoints,
    # on the CPU in float32, each warm-started on its half of the table
    presets = tmp / "runs" / "presets"
    for policy, (preset, template) in zip(tr["policies"], (("qwen2-unigram", CHATML),
                                                           ("llama-char", LLAMA3)), strict=True):
        policy["model_path"] = str(chat_policy(preset, presets, tmp / policy["name"], template))
        policy["device"], policy["compute_dtype"] = "cpu", "float32"
    warm = warm_on_table(warm_cache, TrainerConfig.model_validate(tr),
                         {name: [question(a, b) for a, b in known]
                          for name, known in KNOWN.items()})
    for policy in tr["policies"]:
        policy["model_path"] = str(warm[policy["name"]])
    # sizes and rounds: what two cores run in a minute (and the tiny models' 128 positions)
    tr["grpo"].update(group_size=4, prompts_per_round=4, rounds=3)
    tr["task"]["max_new_tokens"] = 6
    tr["eval"]["benchmarks"][0]["n"] = 2
    # the done-when check: the deterministic exchange (every round reads its peers' records)
    if deterministic:
        tr["exchange"] = {"mode": "deterministic"}
    cfg["up"] = {"restart": "never", "health_timeout": 120, "stop_grace": 60,
                 "status_every": 0.5}
    return cfg


def _warm_cache(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    pytest_cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    return (Path(pytest_cache.mkdir("mutualrl-readme-warm")) if pytest_cache is not None
            else tmp_path / "warm")


def _run(cfg: dict[str, Any], tmp_path: Path) -> tuple[dict[str, Any], Path, list[str]]:
    """`mutualrl up` of `cfg` with the run's secret set, to a finished run: its results.json,
    run directory and policy names."""
    tr = cfg["trainer"]
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run_dir = tmp_path / "runs" / tr["run_id"]
    summary, _ = run_up(path, run_dir, timeout=600, env={"MUTUALRL_AUTH_TOKEN": SECRET})
    assert summary["status"] == "finished" and summary["failure"] is None
    return summary, run_dir, [p["name"] for p in tr["policies"]]


def test_readme_example_shares_both_ways_with_the_secret_set(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    printed = yaml.safe_load(readme_blocks()[0])
    assert set(printed) == {"trainer"}
    cfg = machine(json.loads(json.dumps(printed)), tmp_path, _warm_cache(tmp_path, request))
    tr = cfg["trainer"]
    # What the example is about stays as printed.
    assert len(tr["task"]["rewards"]) >= 2 and tr["task"]["rewards"][1]["weight"] == 0.1
    assert tr["task"]["success_reward"] == "math_verify" and tr["probe"]["kind"] == "sgt"
    assert tr["policies"][1]["chat_template_kwargs"] == {"date_string": "01 Jan 2025"}
    summary, run_dir, names = _run(cfg, tmp_path)
    results = summary["results"]
    assert set(results) == set(names)
    matrix = summary["see_stats"]["matrix"]
    for name, peer in zip(names, reversed(names), strict=True):
        res = results[name]
        # every round published its records (a ROLLOUT per sample, REWARD_STATS per prompt)
        assert res["publish_failed_rounds"] == 0
        assert res["records_published"] >= 3 * 4 * (4 + 1), res
        assert res["records_taken"] > 0, res
        rows = metrics_rows(run_dir, name)
        assert [r["round"] for r in rows] == [0, 1, 2]
        for r in rows:  # both reward functions scored every round, and the publish went out
            assert r["publish_failed"] == 0.0
            # the warm start holds on the run's own rendering: its half of the problems
            assert 0.0 < r["reward/math_verify"] <= 1.0, (name, r)
            assert r["reward_errors/math_verify"] == 0.0 and r["reward_errors/concise"] == 0.0
        # staleness 1: rounds 1 and 2 read exactly the peer's rounds 0 and 1 (all eight
        # problems) ...
        for r in rows[1:]:
            assert r["peer_round"] == r["round"] - 1 and r["peers_complete"] == 1.0, r
        # ... and SGT rescued every problem the peer knows and this policy does not (the peer
        # solves each in some of its samples, this policy in none), also those the peer solved
        # again in round 2 before this policy read its round 0 or 1
        rescued = sum(r.get("rescued_prompts", 0.0) for r in rows)
        assert rescued == len(KNOWN[peer]), (name, rows)
        assert sum(r.get(f"rescue_demos/all/{peer}", 0.0) for r in rows) >= rescued
        assert res["rescued_prompts"] == rescued and set(res["demos_by_donor"]) == {peer}, res
        # SEE's side: the receiver read the peer's statistics of every prompt it rescued, and
        # took at least one of the peer's verified successes for each
        assert matrix["REWARD_STATS"][name][peer] >= rescued, matrix
        assert matrix["VERIFIED_SUCCESS"][name][peer] >= rescued, matrix
        print(f"{name}: rescued {rescued:g} prompts with {peer}'s successes; records "
              f"published {res['records_published']}, taken {res['records_taken']}")
    assert "records published" in (run_dir / "results.md").read_text()


def test_readme_example_as_printed_shares_both_ways_asynchronously(
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """README's example in the mode it prints (no `exchange`: the asynchronous default), with
    the secret set: every round's publish went out (`publish_failed` 0, which only this mode
    can count: the deterministic mode stops at a failed publish) and each policy took the
    other's records. Catches a publish that fails every round in the asynchronous mode (planted:
    `PeerExchange.publish` sending to a run that does not exist) and a run whose policies take
    nothing from each other."""
    printed = yaml.safe_load(readme_blocks()[0])
    assert "exchange" not in printed["trainer"]  # the printed mode is the default
    cfg = machine(json.loads(json.dumps(printed)), tmp_path, _warm_cache(tmp_path, request),
                  deterministic=False)
    assert "exchange" not in cfg["trainer"]
    summary, run_dir, names = _run(cfg, tmp_path)
    results = summary["results"]
    matrix = summary["see_stats"]["matrix"]
    for name, peer in zip(names, reversed(names), strict=True):
        res = results[name]
        rows = metrics_rows(run_dir, name)
        assert [r["round"] for r in rows] == [0, 1, 2]
        assert [r["publish_failed"] for r in rows] == [0.0, 0.0, 0.0], rows
        assert res["publish_failed_rounds"] == 0, res
        assert res["records_published"] >= 3 * 4 * (4 + 1), res
        assert res["records_taken"] > 0, res
        # the asynchronous mode's default lead bound (0) waits for the peer's round itself,
        # so every round read the peer's statistics
        assert res["sharing"]["shared"] == 3, res
        assert matrix["REWARD_STATS"][name][peer] > 0, matrix
        print(f"{name}: published {res['records_published']}, took {res['records_taken']} "
              f"({matrix['REWARD_STATS'][name][peer]} of {peer}'s statistics)")
