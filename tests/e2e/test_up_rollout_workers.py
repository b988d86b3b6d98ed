"""`mutualrl up` with two policies whose rollouts run in workers of their own, beside their
updates (d = 1), under SGT with the run's secret set: the policies share both ways, every SEE
record carries the weight version that sampled it, and a rollout worker killed mid-run costs
its policy a delay (the learner starts another), not the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_up import metrics_rows, see_records, up_config, write_yaml

from mutualrl.common.auth import derive_token

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1100)]

SECRET = "up-workers-7c1a"
RUN = "up-workers"
ROUNDS = 24
POLICIES = ("gpt2-bpe", "llama-char")


def _records(rest: str) -> list[dict]:
    try:
        return see_records(rest, RUN, derive_token(SECRET, "read"), limit=300)
    except OSError:  # SEE not up yet, or gone at the end
        return []


def _worker_of(trainer: int) -> int | None:
    """The trainer's rollout worker: its child started by multiprocessing's spawn."""
    out = subprocess.run(["ps", "-ww", "--ppid", str(trainer), "-o", "pid=,args="],
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        pid, _, args = line.strip().partition(" ")
        if "spawn_main" in args:
            return int(pid)
    return None


def _logs(tmp_path: Path, run_dir: Path) -> str:
    """The tails of `up`'s log and of each trainer's, for a run that failed or did not end."""
    paths = [tmp_path / "up.log", *sorted((run_dir / "logs").glob("trainer-*.log"))]
    return "\n".join(f"--- {p.name}\n{p.read_text()[-2500:]}" for p in paths if p.exists())


def _rounds_done(run_dir: Path, name: str) -> int:
    path = run_dir / name / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_up_with_rollout_workers_shares_records_versions_and_survives_a_kill(
        tmp_path: Path) -> None:
    cfg = up_config(tmp_path, RUN, ROUNDS, deadline_seconds=10.0)
    cfg["up"]["health_timeout"] = 300
    t = cfg["trainer"]
    t["grpo"]["max_off_policy_steps"] = 1
    t["services"] = {"timeout": 120.0}
    for p in t["policies"]:
        p["rollout_worker"] = True
    path = write_yaml(tmp_path / "workers.yaml", cfg)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # private redis-server
    env["MUTUALRL_AUTH_TOKEN"] = SECRET
    log = (tmp_path / "up.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "mutualrl.cli", "up", "-c", str(path)],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    run_dir = tmp_path / "runs" / RUN
    seen: dict[tuple[str, int], int] = {}
    killed: int | None = None
    try:
        deadline = time.monotonic() + 840
        # kill llama-char's worker once two rounds are in, polling fast: a round takes < 1 s
        while killed is None and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
            state_path = run_dir / "up.json"
            trainer = (json.loads(state_path.read_text())["pids"].get("trainer-llama-char")
                       if state_path.exists() else None)
            if trainer and _rounds_done(run_dir, "llama-char") >= 2:
                killed = _worker_of(trainer)
                if killed is not None:
                    os.kill(killed, signal.SIGKILL)
        while proc.poll() is None and time.monotonic() < deadline:
            state = json.loads((run_dir / "up.json").read_text())
            for r in _records(state["endpoints"]["see_rest"]):
                seen[(r["policy_id"], int(r["round"]))] = int(r["policy_version"])
            time.sleep(1.0)
        try:
            code: int | None = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            code = None  # still running: the logs below say where it stands
        assert code == 0, _logs(tmp_path, run_dir)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=90)
        log.close()
    assert killed is not None, "no rollout worker process was found to kill"
    trainer_log = (run_dir / "logs" / "trainer-llama-char.log").read_text()
    assert "the rollout worker" in trainer_log and "died" in trainer_log, trainer_log[-3000:]
    rows = {n: metrics_rows(run_dir, n) for n in POLICIES}
    for name in POLICIES:
        assert [r["round"] for r in rows[name]] == list(range(ROUNDS)), name
        # beside the update: round k sampled by version k - 1 (or newer after the restart)
        for r in rows[name]:
            assert r["round"] - 1 <= r["policy_version"] <= r["round"], r
    assert rows["llama-char"][-1]["rollout/restarts"] >= 1
    assert sum(r["off_policy_lag"] for r in rows["gpt2-bpe"]) == ROUNDS - 1
    # every record read carries the version that sampled its round's rollouts
    by_round = {(n, int(r["round"])): int(r["policy_version"]) for n in POLICIES
                for r in rows[n]}
    assert seen and all(by_round[key] == v for key, v in seen.items()), (seen, by_round)
    assert {p for p, _ in seen} == set(POLICIES)
    summary = json.loads((run_dir / "results.json").read_text())
    taken = summary["see_stats"]["matrix"]["REWARD_STATS"]
    assert {t: set(s) for t, s in taken.items()} == {"gpt2-bpe": {"llama-char"},
                                                     "llama-char": {"gpt2-bpe"}}
