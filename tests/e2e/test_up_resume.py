"""A second `mutualrl up` of a run resumes it: a finished 3-round run asked for 5 rounds trains
rounds 3 and 4 only (every policy from its latest checkpoint, SEE keeping the first three rounds'
records for the deterministic exchange), and each round is in metrics.jsonl once, also a round
a crash had logged past the checkpoint. `up` of a run that trained all its rounds starts
nothing; a run file that changed what the run is of is refused (exit 2, naming `--fresh`); and
`--fresh` starts it again from round 0 with SEE emptied of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from tiny_up import up_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3060)]

POLICIES = ("gpt2-bpe", "llama-char")
PROMPTS = 4


def _up(tmp_path: Path, cfg: dict[str, Any], *extra: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # private redis-server
    return subprocess.run([sys.executable, "-m", "mutualrl.cli", "up", "-c", str(path), *extra],
                          capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)


def _rows(run_dir: Path, policy: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / policy / "metrics.jsonl").read_text().splitlines()]


def _checkpoints(run_dir: Path, policy: str) -> list[str]:
    return sorted(p.name for p in (run_dir / policy / "checkpoints").iterdir())


def _published(run_dir: Path) -> dict[str, int]:
    """REWARD_STATS records SEE holds per policy (from the results `up` wrote)."""
    stats = json.loads((run_dir / "results.json").read_text())["see_stats"]
    return {p["policy_id"]: p["published"].get("REWARD_STATS", 0) for p in stats["policies"]}


def test_a_second_up_resumes_each_policy_and_logs_each_round_once(tmp_path: Path) -> None:
    cfg = up_config(tmp_path, "resume", rounds=3, deadline_seconds=5.0)
    cfg["trainer"]["exchange"] = {"mode": "deterministic"}
    cfg["trainer"]["checkpoint"] = {"every": 1, "keep": 2}
    run_dir = tmp_path / "runs" / "resume"

    first = _up(tmp_path, cfg)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    before = {p: _rows(run_dir, p) for p in POLICIES}
    assert {p: [r["round"] for r in rows] for p, rows in before.items()} == \
        {p: [0, 1, 2] for p in POLICIES}
    # A crash had logged round 3 of one policy after its last checkpoint (round-3).
    with (run_dir / "llama-char" / "metrics.jsonl").open("a") as fh:
        fh.write(json.dumps({"round": 3, "policy": "llama-char", "reward_mean": -1.0}) + "\n")

    cfg["trainer"]["grpo"]["rounds"] = 5
    second = _up(tmp_path, cfg)
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-3000:]
    assert "resuming run resume: gpt2-bpe from round 3, llama-char from round 3" in out
    for policy in POLICIES:
        rows = _rows(run_dir, policy)
        assert [r["round"] for r in rows] == [0, 1, 2, 3, 4], (policy, rows)
        assert rows[:3] == before[policy]  # rounds 0-2 were not trained again
        assert all(r["reward_mean"] >= 0.0 for r in rows)  # the crash's row is gone
        assert _checkpoints(run_dir, policy) == ["round-000004", "round-000005"]
        log = (run_dir / "logs" / f"trainer-{policy}.log").read_text()
        assert "(round 3)" in log  # "resumed <policy> from <checkpoint> (round 3)"
    # SEE kept rounds 0-2 (the private Redis persists in the run directory) and added 3-4.
    assert _published(run_dir) == {p: 5 * PROMPTS for p in POLICIES}
    summary = json.loads((run_dir / "results.json").read_text())
    stats = summary["see_stats"]["matrix"]["REWARD_STATS"]
    assert {t: set(s) for t, s in stats.items()} == {p: set(POLICIES) - {p} for p in POLICIES}

    # Nothing left to train: nothing starts.
    third = _up(tmp_path, cfg)
    assert third.returncode == 0, third.stdout[-3000:]
    assert "has trained its rounds already" in third.stdout
    assert "dashboard" not in third.stdout

    # Another seed is another run: refused, naming the field and --fresh.
    cfg["trainer"]["seed"] = 7
    refused = _up(tmp_path, cfg)
    assert refused.returncode == 2, refused.stdout[-3000:]
    text = refused.stdout.replace("\n", "")
    assert "trainer.seed: 0 -> 7" in text and "--fresh" in text
    assert [r["round"] for r in _rows(run_dir, "gpt2-bpe")] == [0, 1, 2, 3, 4]

    # --fresh: from round 0, with SEE's records of the old run gone.
    cfg["trainer"]["grpo"]["rounds"] = 2
    fresh = _up(tmp_path, cfg, "--fresh")
    assert fresh.returncode == 0, fresh.stdout[-3000:] + fresh.stderr[-3000:]
    assert "resuming" not in fresh.stdout
    for policy in POLICIES:
        assert [r["round"] for r in _rows(run_dir, policy)] == [0, 1]
        assert _checkpoints(run_dir, policy) == ["round-000001", "round-000002"]
    assert _published(run_dir) == {p: 2 * PROMPTS for p in POLICIES}
