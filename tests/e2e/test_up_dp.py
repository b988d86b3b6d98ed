"""`mutualrl up` with a data-parallel policy: llama-char trained by 2 gloo ranks (`nproc: 2`)
beside gpt2-bpe in one process, SGT through real Redis, SEE, THL and MWRA. Rank 0 publishes
the whole round (both ranks' samples) and reads the peer; the plan reaches rank 1 by broadcast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_up import up_config, write_yaml

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROUNDS = 3


def test_up_trains_a_two_rank_policy_with_a_peer_through_the_services(tmp_path: Path) -> None:
    cfg = up_config(tmp_path, "up-dp", ROUNDS, deadline_seconds=5.0)
    cfg["trainer"]["policies"][1]["nproc"] = 2  # llama-char on two gloo ranks
    path = write_yaml(tmp_path / "dp.yaml", cfg)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # private redis-server
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "mutualrl.cli", "up", "-c", str(path)],
                          capture_output=True, text=True, env=env, timeout=540)
    run_dir = tmp_path / "runs" / "up-dp"
    log = (run_dir / "logs" / "trainer-llama-char.log")
    assert proc.returncode == 0, (proc.stdout[-2000:] + proc.stderr[-2000:]
                                  + (log.read_text()[-3000:] if log.exists() else ""))
    for name in ("gpt2-bpe", "llama-char"):
        rows = [json.loads(x) for x in (run_dir / name / "metrics.jsonl").read_text()
                .splitlines()]
        assert [r["round"] for r in rows] == list(range(ROUNDS))  # rank 0 alone logs
        # Round 0 may be planned before the slower trainer registered; after it the probe
        # reads its peer every round (no fall-back to GRPO).
        assert all(r["fallback"] == 0.0 for r in rows[1:]), (name, rows)
    # Each policy read the other's round stats from SEE: the 2-rank policy published its round.
    summary = json.loads((run_dir / "results.json").read_text())
    stats = summary["see_stats"]["matrix"]["REWARD_STATS"]
    assert {t: set(s) for t, s in stats.items()} == {"gpt2-bpe": {"llama-char"},
                                                     "llama-char": {"gpt2-bpe"}}
    final = f"round-{ROUNDS:06d}"
    assert (run_dir / "llama-char" / "checkpoints" / final / "dcp").is_dir()
    assert not (run_dir / "gpt2-bpe" / "checkpoints" / final / "dcp").exists()
    # Two ranks wrote llama-char's checkpoint (one DCP file each).
    manifest = json.loads((run_dir / "llama-char" / "checkpoints" / final / "checkpoint.json")
                          .read_text())
    assert manifest["world"] == 2 and manifest["dcp"] is True
    assert len(list((run_dir / "llama-char" / "checkpoints" / final / "dcp")
                    .glob("*.distcp"))) == 2
