"""`mutualrl up` with a run secret hands each trainer its policy's token only (#14 item 13):
the trainer processes never see the secret, yet create nothing they may not (the launcher
creates the run), register their own tokenizer, train and publish."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_up import see_records, up_config, write_yaml

from mutualrl.common.auth import derive_token

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SECRET = "up-secret-5d2e"
POLICIES = ("gpt2-bpe", "llama-char")


def _config(tmp_path: Path) -> Path:
    cfg = up_config(tmp_path, "up-tokens", 10_000)
    assert tuple(p["name"] for p in cfg["trainer"]["policies"]) == POLICIES
    return write_yaml(tmp_path / "tokens.yaml", cfg)


def _records(rest: str) -> list[dict]:
    return see_records(rest, "up-tokens", derive_token(SECRET, "read"))


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").partition("=")[::2] for item in raw if item)


def _rounds(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [json.loads(line)["round"] for line in path.read_text().splitlines() if line]


def test_up_trainers_hold_only_their_policy_token(tmp_path: Path) -> None:
    config = _config(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # private redis-server
    env["MUTUALRL_AUTH_TOKEN"] = SECRET
    log = (tmp_path / "up.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "mutualrl.cli", "up", "-c", str(config)],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    run_dir = tmp_path / "runs" / "up-tokens"
    state_path = run_dir / "up.json"
    environs: dict[str, dict[str, str]] = {}
    try:
        deadline = time.monotonic() + 300
        done = False
        while time.monotonic() < deadline and not done:
            assert proc.poll() is None, (tmp_path / "up.log").read_text()[-3000:]
            time.sleep(1.0)
            if not state_path.exists():
                continue
            state = json.loads(state_path.read_text())
            for name in POLICIES:
                pid = state["pids"].get(f"trainer-{name}")
                if pid is not None and name not in environs:
                    environs[name] = _environ(pid)
            if len(environs) < len(POLICIES):
                continue
            published = {r["policy_id"] for r in _records(state["endpoints"]["see_rest"])}
            trained = all(0 in _rounds(run_dir / n / "metrics.jsonl") for n in POLICIES)
            done = published == set(POLICIES) and trained
        logs = {n: (run_dir / "logs" / f"trainer-{n}.log").read_text() for n in POLICIES}
        assert done, (tmp_path / "up.log").read_text()[-3000:] + str(logs)[-3000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()
    for name in POLICIES:
        got = environs[name]
        assert got["MUTUALRL_AUTH_TOKEN"] == derive_token(SECRET, f"policy:{name}"), name
        assert SECRET not in got.values(), f"trainer-{name} inherited the run's secret"
        assert "PERMISSION_DENIED" not in logs[name], logs[name][-2000:]
    # Nothing a trainer reads carries the secret either.
    assert SECRET not in (run_dir / "run.yaml").read_text()
