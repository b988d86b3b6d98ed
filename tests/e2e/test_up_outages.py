"""A service that dies costs the run a delay, not a trainer: `mutualrl up` with trainers allowed
no restart (`max_restarts: 0`) and services one each; THL, then MWRA, then SEE are SIGKILLed
once mid-run. The supervisor starts each again, the trainers' calls ride out the outage (the
SDK's outage budget), the run ends with exit 0, and SEE holds every round's records of both
policies, which read each other's all along (the deterministic exchange waits for them)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from tiny_up import up_config, write_yaml

pytestmark = [pytest.mark.slow, pytest.mark.timeout(780)]

ROUNDS = 9
POLICIES = ("gpt2-bpe", "llama-char")
PROMPTS, GROUP = 4, 4


def _rounds_done(run_dir: Path) -> int:
    """Rounds every policy has logged so far."""
    done = []
    for policy in POLICIES:
        path = run_dir / policy / "metrics.jsonl"
        done.append(len(path.read_text().splitlines()) if path.exists() else 0)
    return min(done)


def _records(rest: str, run_id: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor = ""
    while True:
        url = f"{rest}/v1/runs/{run_id}/records?limit=1000" + (f"&cursor={cursor}" if cursor
                                                               else "")
        with urllib.request.urlopen(url, timeout=10) as reply:
            page = json.loads(reply.read())
        out += page["records"]
        if page["next_cursor"] is None:
            return out
        cursor = page["next_cursor"]


def test_up_rides_out_a_kill_of_thl_then_mwra_then_see(tmp_path: Path) -> None:
    run_id = "up-outages"
    cfg = up_config(tmp_path, run_id, rounds=ROUNDS, deadline_seconds=5.0)
    cfg["up"].update(restart="on-failure", max_restarts=0, service_restarts=1,
                     serve_after=True)
    cfg["trainer"]["exchange"] = {"mode": "deterministic"}
    cfg["trainer"]["checkpoint"] = {"every": 1}
    config = write_yaml(tmp_path / "outages.yaml", cfg)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # private redis-server
    log_path = tmp_path / "up.log"
    log = log_path.open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "mutualrl.cli", "up", "-c", str(config)],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    run_dir = tmp_path / "runs" / run_id
    state_path = run_dir / "up.json"
    killed: dict[str, tuple[int, int]] = {}  # service -> (pid killed, round it was killed at)
    try:
        deadline = time.monotonic() + 480
        plan = iter((("thl", 1), ("mwra", 3), ("see", 5)))
        victim, at = next(plan)
        while victim:
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            assert proc.poll() is None, log_path.read_text()[-3000:]
            done = _rounds_done(run_dir)
            assert done < ROUNDS, f"the run finished before {victim} was killed"
            if done >= at and state_path.exists():
                pids = json.loads(state_path.read_text())["pids"]
                previous = [p for p, _ in killed.values()]
                if pids[victim] not in previous:
                    os.killpg(pids[victim], signal.SIGKILL)
                    killed[victim] = (pids[victim], done)
                    victim, at = next(plan, ("", 0))
            time.sleep(0.1)
        text = ""
        while "services stay up" not in text:  # every trainer finished (exit 0)
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            assert proc.poll() is None, log_path.read_text()[-3000:]
            time.sleep(0.5)
            text = log_path.read_text()
        state = json.loads(state_path.read_text())
        records = _records(state["endpoints"]["see_rest"], run_id)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    text = log_path.read_text()
    assert code == 0, text[-3000:]
    # Each service was killed once and started again once; no trainer was restarted.
    assert set(killed) == {"thl", "mwra", "see"}
    for name, (pid, _) in killed.items():
        assert state["pids"][name] != pid, name
        assert f"restarting {name} (1/1)" in text, name
    assert "restarting trainer" not in text
    # Every round of each policy is in SEE: its rollouts and its per-prompt statistics.
    for policy in POLICIES:
        rows = [json.loads(x) for x in (run_dir / policy / "metrics.jsonl").read_text()
                .splitlines()]
        assert [r["round"] for r in rows] == list(range(ROUNDS))
        for kind, per_round in (("ROLLOUT", PROMPTS * GROUP), ("REWARD_STATS", PROMPTS)):
            counts = [sum(1 for r in records if (r["policy_id"], r["kind"], r["round"])
                          == (policy, kind, k)) for k in range(ROUNDS)]
            assert counts == [per_round] * ROUNDS, (policy, kind, counts)
    # Both read each other every round: the deterministic exchange took no fallback.
    summary = json.loads((run_dir / "results.json").read_text())
    stats = summary["see_stats"]["matrix"]["REWARD_STATS"]
    assert {t: set(s) for t, s in stats.items()} == {p: set(POLICIES) - {p} for p in POLICIES}
    # What the outages cost: each trainer logged the services it found away and back.
    delays = [float(x) for policy in POLICIES for x in re.findall(
        r"answers again after ([0-9.]+) s",
        (run_dir / "logs" / f"trainer-{policy}.log").read_text())]
    assert delays, "no trainer saw an outage"
    print(f"killed at rounds {({n: r for n, (_, r) in killed.items()})}; "
          f"outages seen by trainers: {sorted(delays)} s")
