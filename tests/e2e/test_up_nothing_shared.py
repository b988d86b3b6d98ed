"""A shared run in which one policy read no peer data fails: `mutualrl up` of two policies
asked to share (SGT, the asynchronous exchange without a lead bound) where `llama-char` waits
0.01 s for its peer's records of a round, and `gpt2-bpe`'s reward function takes 8 s a call
in gpt2-bpe's trainer, so gpt2-bpe publishes each round's records long after llama-char has
read in vain, while it reads llama-char's, there before it looks. Every trainer ends with exit
0; `up` exits 1, names the policy that read nothing (and only it) in its console and in
results.json, and still writes the results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_up import metrics_rows, up_config, write_yaml

pytestmark = [pytest.mark.slow, pytest.mark.timeout(660)]

# The reward (exact answer) takes 8 s a call in gpt2-bpe's trainer (`--policy gpt2-bpe`).
REWARDS = """import sys
import time


def exact(completions, answer, **kw):
    if "gpt2-bpe" in sys.argv:
        time.sleep(8)
    return [float(c.strip() == str(a)) for c, a in zip(completions, answer)]
"""


def test_up_fails_naming_the_policy_that_read_no_peer(tmp_path: Path) -> None:
    """Catches `up` exiting 0 on a run in which a policy read no peer (planted: `final_report`
    without `failure = failure or nothing_shared(res)`: "assert 0 == 1", up's exit code) and a
    failure that names the wrong policies."""
    table = tmp_path / "sums.jsonl"
    table.write_text("".join(json.dumps({"prompt": f"{a}+{a + 1}=", "answer": 2 * a + 1}) + "\n"
                             for a in range(8)))
    (tmp_path / "rewards.py").write_text(REWARDS)
    cfg = up_config(tmp_path, "alone", rounds=2, deadline_seconds=30.0)
    cfg["trainer"]["task"] = {"dataset": {"path": str(table)}, "max_new_tokens": 6,
                              "rewards": [{"fn": f"{tmp_path / 'rewards.py'}:exact"}]}
    cfg["trainer"]["exchange"] = {"mode": "asynchronous", "max_lead_rounds": None}
    slow, fast = cfg["trainer"]["policies"]
    assert (slow["name"], fast["name"]) == ("gpt2-bpe", "llama-char")
    fast["probe"] = {"deadline_seconds": 0.01}
    path = write_yaml(tmp_path / "alone.yaml", cfg)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # private redis-server
    proc = subprocess.run([sys.executable, "-m", "mutualrl.cli", "up", "-c", str(path)],
                          capture_output=True, text=True, env=env, timeout=600,
                          cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    run_dir = tmp_path / "runs" / "alone"
    # Both trainers trained every round (no trainer failed); llama-char read nothing ...
    rows = {p: metrics_rows(run_dir, p) for p in ("gpt2-bpe", "llama-char")}
    assert {p: [r["round"] for r in x] for p, x in rows.items()} == \
        {"gpt2-bpe": [0, 1], "llama-char": [0, 1]}
    assert [r["shared"] for r in rows["llama-char"]] == [0.0, 0.0], rows["llama-char"]
    assert sum(r["shared"] for r in rows["gpt2-bpe"]) >= 1.0, rows["gpt2-bpe"]
    # ... and the run failed for the one policy that read nothing.
    summary = json.loads((run_dir / "results.json").read_text())
    assert summary["status"] == "failed", summary["failure"]
    assert summary["failure"].startswith("llama-char read no peer data in any round"), summary
    assert "gpt2-bpe" not in summary["failure"]
    assert "the run failed: llama-char read no peer data" in " ".join(out.split()), out[-4000:]
    assert summary["results"]["gpt2-bpe"]["sharing"]["shared"] >= 1.0
