"""`mutualrl up`'s report: who learned what from whom, the plot from the warm start, and the
round-barrier arithmetic of `mutualrl bench rounds` (pure; files in tmp_path)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mutualrl.bench.rounds import barrier_round_time
from mutualrl.launch.report import (
    demos_by_donor,
    learned_table,
    nothing_shared,
    plot_curves,
    results,
)


def _plan(tmp_path: Path) -> object:
    from mutualrl.launch.plan import LaunchPlan

    warm = tmp_path / "warm-a"
    warm.mkdir()
    (warm / "sft_eval.json").write_text(json.dumps(
        {"heldout_accuracy": {"add": 0.9, "rev": 0.0, "mean": 0.45}}))
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"trainer": {"policies": [
        {"name": "a", "sft_checkpoint": str(warm)}, {"name": "b"}]}}))
    files = {}
    for name, donor in (("a", "b"), ("b", "a")):
        rows = []
        for k in range(4):
            row = {"round": k, "reward_mean": 0.5, f"rescue_demos/rev/{donor}": 2.0}
            if k in (1, 3):
                row.update({"heldout/add": 0.9, "heldout/rev": 0.1 * k, "heldout/mean": 0.5})
            rows.append(row)
        path = tmp_path / name / "metrics.jsonl"
        path.parent.mkdir()
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        files[name] = path
    return LaunchPlan(run_dir=tmp_path, config_path=cfg, up=None, run_id="t",  # type: ignore[arg-type]
                policies=["a", "b"], metrics_files=files, rounds=4)


def test_learned_from_whom_and_plot_from_the_warm_start(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    res = results(plan)  # type: ignore[arg-type]
    assert res["a"]["demos_by_donor"] == {"b": {"rev": 8.0}}
    assert res["a"]["start_label"] == "warm start" and res["a"]["heldout_start"]["rev"] == 0.0
    assert res["b"]["start_label"] == "round 1"
    table = learned_table(res)
    assert table is not None and table.row_count == 2
    assert demos_by_donor([{"round": 0}]) == {}
    png = tmp_path / "curves.png"
    plot_curves(plan, png)  # type: ignore[arg-type]
    assert png.stat().st_size > 10_000


def test_barrier_round_time_is_the_pace_of_the_slowest_policy() -> None:
    times = {"a": [1.0, 2.0, 3.0, 4.0], "b": [1.5, 2.2, 3.9, 4.1]}
    # barriers 1.5, 2.2, 3.9, 4.1 -> gaps after the first: 1.7, 0.2
    assert barrier_round_time(times, skip=1) == pytest.approx(0.95)
    with pytest.raises(ValueError):
        barrier_round_time(times, skip=3)


def test_benchmark_figures_and_curves_reach_the_results(tmp_path: Path) -> None:
    from mutualrl.launch.report import benchmarks, results_markdown, status_table

    rows = [{"round": 0, "reward_mean": 0.1, "start/bench/gsm/avg@4": 0.125,
             "start/bench/gsm/pass@4": 0.25, "start/heldout/add": 0.5, "shared": 0.0},
            {"round": 1, "bench/gsm/avg@4": 0.25, "bench/gsm/pass@4": 0.5,
             "bench/gsm/small/avg@4": 0.5, "bench/gsm/problems": 8.0},
            {"round": 3, "bench/gsm/avg@4": 0.5, "bench/gsm/pass@4": 0.75,
             "bench/gsm/small/avg@4": 1.0, "bench/gsm/problems": 8.0,
             "bench/gsm/dropped_overlong": 3.0}]
    b = benchmarks(rows)["gsm"]
    assert b["final"] == {"avg@4": 0.5, "pass@4": 0.75, "problems": 8.0,
                          "dropped_overlong": 3.0}
    assert b["skills"] == {"small": {"avg@4": 1.0}}
    assert b["start"] == {"avg@4": 0.125, "pass@4": 0.25}  # before round 0: 0 rounds done
    assert [c["round"] for c in b["curve"]] == [0, 2, 4] and b["curve"][1]["pass@4"] == 0.5
    assert b["curve"][0] == {"round": 0, "avg@4": 0.125, "pass@4": 0.25}
    plan = _plan(tmp_path)
    path = plan.metrics_files["b"]  # type: ignore[attr-defined]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = results(plan)  # type: ignore[arg-type]
    assert res["b"]["benchmarks"]["gsm"]["final"]["pass@4"] == 0.75
    assert res["b"]["start_label"] == "before round 0"
    assert res["b"]["heldout_start"] == {}  # no held-out evaluation after round 0 to pair
    # rounds 1 and 3 have no `shared` metric: only round 0's counts, and it read nothing
    assert res["b"]["sharing"] == {"rounds": 1, "shared": 0.0, "fraction": 0.0,
                                   "lead_wait_s": 0.0}
    md = results_markdown(res)
    assert "| b | gsm | pass@4 | 0.250 | 0.750 |" in md and "| b | 0 of 1 | 0.00 |" in md
    assert "| gsm | 8 | 3 |" in md  # problems scored, dropped as over-long
    from rich.console import Console

    from mutualrl.launch.report import benchmark_table, sharing_table

    console = Console(width=200, record=True)
    for table in (benchmark_table(res), sharing_table(res)):
        assert table is not None
        console.print(table)
    text = console.export_text()
    assert "0.125→0.500" in text and "0.250→0.750" in text and "0/1" in text
    assert "gsm: 8 problems scored, 3 dropped as longer than a policy's limit" in " ".join(
        text.split())
    console.print(status_table(plan, set()))  # type: ignore[arg-type]
    line = next(x for x in console.export_text().splitlines() if " b " in x)
    assert "0.500" in line  # b's held-out column: the benchmark's avg@4 (its reward is 0)


def test_a_policy_that_read_no_peer_in_any_round_fails_a_shared_run() -> None:
    read = {"sharing": {"rounds": 3, "shared": 2.0, "fraction": 0.67, "lead_wait_s": 0.0}}
    none = {"sharing": {"rounds": 3, "shared": 0.0, "fraction": 0.0, "lead_wait_s": 0.0}}
    grpo = {"sharing": None}  # probe `none`: nothing to read, nothing asked
    assert nothing_shared({"a": read, "b": read}) is None
    assert nothing_shared({"a": grpo, "b": grpo}) is None
    assert nothing_shared({"a": none}) is None  # one policy alone has no peers
    reason = nothing_shared({"a": read, "b": none, "c": none})
    assert reason is not None and reason.startswith("b, c read no peer data in any round")


def test_threads_and_rollout_workers_per_policy_reach_the_results(tmp_path: Path) -> None:
    """`up`'s results carry what MWRA gave each policy: threads that moved, the rollout
    workers and their threads, and the rollout / update seconds per round."""
    from rich.console import Console

    from mutualrl.launch.report import compute_table, results_markdown

    plan = _plan(tmp_path)
    rows = [{"round": k, "threads": t, "step_s": 10.0, "rollout_s": r, "update_s": 4.0,
             "rollout_workers": w, "rollout_threads": w}
            for k, (t, r, w) in enumerate(((1, 6.0, 0), (2, 5.0, 1), (2, 4.0, 1)))]
    plan.metrics_files["a"].write_text(  # type: ignore[attr-defined]
        "".join(json.dumps(r) + "\n" for r in rows))
    res = results(plan)  # type: ignore[arg-type]
    assert res["a"]["compute"] == {
        "threads_first": 1, "threads_last": 2, "threads_min": 1, "threads_max": 2,
        "rollout_workers": 1, "rollout_threads": 1, "mean_rollout_s": 5.0,
        "mean_update_s": 4.0, "mean_step_s": 10.0}
    assert res["b"]["compute"]["threads_last"] is None  # rows without MWRA's fields
    md = results_markdown(res)
    assert "| a | 2 (1-2) | 1 | 1 | 5.00 | 4.00 | 10.00 |" in md
    assert "| b | - | 0 | 0 | - | - | - |" in md
    console = Console(record=True, width=200)
    table = compute_table(res)
    assert table is not None and table.row_count == 2
    console.print(table)
    assert "2 (1-2)" in console.export_text()
