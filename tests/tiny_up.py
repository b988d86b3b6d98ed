"""The smallest `mutualrl up` run file: two tiny policies of two families under SGT, shared by
the e2e tests that launch `mutualrl up` as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml


def up_config(tmp_path: Path, run_id: str, rounds: int,
              deadline_seconds: float = 2.0) -> dict[str, Any]:
    """GPT-2 + byte BPE and Llama + chars, 4 prompts x 4 samples of 6 new tokens a round."""
    return {
        "up": {"restart": "never", "health_timeout": 120, "stop_grace": 60, "status_every": 0.5},
        "trainer": {
            "run_id": run_id,
            "output_dir": str(tmp_path / "runs"),
            "task": {"regime": "short", "skills": ["add", "rev"], "heldout_per_skill": 8},
            "grpo": {"group_size": 4, "prompts_per_round": 4, "rounds": rounds,
                     "max_new_tokens": 6},
            "probe": {"kind": "sgt", "deadline_seconds": deadline_seconds},
            "eval": {"every": 0},
            "checkpoint": {"every": 1000},
            "metrics": {"tensorboard": False},
            "policies": [{"name": "gpt2-bpe", "preset": "gpt2-bpe"},
                         {"name": "llama-char", "preset": "llama-char"}],
        },
    }


def write_yaml(path: Path, cfg: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_up(path: Path, run_dir: Path, timeout: float,
           env: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
    """`mutualrl up -c <path>` as a user runs it (its own private redis-server; `env` added to
    the environment), from `path`'s folder, to its end: asserts exit 0, showing the tail of its
    output otherwise, and returns the run's results.json and what the console printed."""
    full = {k: v for k, v in os.environ.items() if k != "REDIS_URL"} | (env or {})
    proc = subprocess.run([sys.executable, "-m", "mutualrl.cli", "up", "-c", str(path)],
                          capture_output=True, text=True, env=full, timeout=timeout,
                          cwd=path.parent)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary: dict[str, Any] = json.loads((run_dir / "results.json").read_text())
    return summary, proc.stdout


def metrics_rows(run_dir: Path, policy: str) -> list[dict[str, Any]]:
    """A policy's metrics.jsonl rows."""
    return [json.loads(x) for x in (run_dir / policy / "metrics.jsonl").read_text().splitlines()]


def see_records(rest: str, run_id: str, token: str, limit: int = 100) -> list[dict[str, Any]]:
    """The run's records through SEE's REST API with a read token ([] before the run exists)."""
    req = urllib.request.Request(f"{rest}/v1/runs/{run_id}/records?limit={limit}",
                                 headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=5) as reply:
            return list(json.loads(reply.read())["records"])
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return []
        raise
