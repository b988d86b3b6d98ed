"""`mutualrl up` with one policy on vLLM and one on the HF engine, SGT through real Redis, SEE,
THL and MWRA (runs in .venv-vllm: `make test-vllm`).

The vLLM policy takes its ratio against the engine's behaviour log-probs
(`ratio_to_behaviour`): with one step per round that ratio is exactly 1 when the engine's
log-probs equal the trainer's, so no token may be clipped in any round, after every sync.

The exchange is deterministic (s = 1): the vLLM policy's engine takes tens of seconds to start
and warm up, longer than the HF policy's three rounds take, so in the asynchronous mode the HF
policy could fall back in every round and read nothing from its peer. Here every round r >= 1
of both reads the other's round r - 1, whatever their speeds."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_up import up_config, write_yaml

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(900),
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vLLM is not installed (make setup-vllm)")]

ROUNDS = 3


def test_up_trains_a_vllm_policy_beside_an_hf_one_with_sgt(tmp_path: Path) -> None:
    cfg = up_config(tmp_path, "up-vllm", ROUNDS, deadline_seconds=10.0)
    cfg["up"]["health_timeout"] = 300
    llama = cfg["trainer"]["policies"][1]
    llama.update(rollout_engine="vllm", vllm={"kv_cache_gib": 0.1},
                 grpo={"ratio_to_behaviour": True})
    cfg["trainer"]["checkpoint"] = {"every": 1}
    cfg["trainer"]["exchange"] = {"mode": "deterministic", "staleness": 1}
    # A vLLM engine starting beside the services on a loaded 2-core machine slows their
    # answers: a longer per-call deadline than the 30 s default.
    cfg["trainer"]["services"] = {"timeout": 120.0}
    path = write_yaml(tmp_path / "vllm.yaml", cfg)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # private redis-server
    proc = subprocess.run([sys.executable, "-m", "mutualrl.cli", "up", "-c", str(path)],
                          capture_output=True, text=True, env=env, timeout=840)
    run_dir = tmp_path / "runs" / "up-vllm"
    log = run_dir / "logs" / "trainer-llama-char.log"
    assert proc.returncode == 0, (proc.stdout[-2000:] + proc.stderr[-2000:]
                                  + (log.read_text()[-3000:] if log.exists() else ""))
    assert "vLLM" in log.read_text() or "vllm" in log.read_text()  # the engine really ran
    rows = {}
    for name in ("gpt2-bpe", "llama-char"):
        rows[name] = [json.loads(x) for x in (run_dir / name / "metrics.jsonl").read_text()
                      .splitlines()]
        assert [r["round"] for r in rows[name]] == list(range(ROUNDS))
        # No fall-back, and from round 1 on each round read the peer's previous round.
        assert all(r["fallback"] == 0.0 for r in rows[name]), (name, rows[name])
        assert [r.get("peer_round") for r in rows[name][1:]] == list(range(ROUNDS - 1)), name
    # Behaviour log-probs from vLLM equal the trainer's, round after round (weights synced).
    for r in rows["llama-char"]:
        assert r["clip_frac"] == 0.0 and abs(r["approx_kl"]) < 1e-4, r
    summary = json.loads((run_dir / "results.json").read_text())
    stats = summary["see_stats"]["matrix"]["REWARD_STATS"]
    assert {t: set(s) for t, s in stats.items()} == {"gpt2-bpe": {"llama-char"},
                                                     "llama-char": {"gpt2-bpe"}}
