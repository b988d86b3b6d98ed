"""`mutualrl up` with a policy across nodes: llama-char on two "nodes" (`nnodes: 2, nproc: 1`:
two launchers on this machine, one gloo rank each, a c10d rendezvous on 127.0.0.1) beside
gpt2-bpe in one process, SGT through real Redis, SEE, THL and MWRA, the deterministic exchange.

- Both policies take the other's records, and the final parameters of both equal those of the
  same run with llama-char's two ranks on one node (`nnodes: 1, nproc: 2`).
- Killing one node's launcher mid-run (SIGKILL: its rank dies with it) ends the policy's
  rendezvous; `up` stops the other node and restarts both from the latest checkpoint, and the
  run ends with every round of both policies once in their metrics.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tiny_up import metrics_rows, run_up, up_config, write_yaml

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2600)]

ROUNDS = 3
ATOL = 1e-5
"""As tests/integration/test_trainer_dp.py: two ranks on two nodes or on one reduce the same
gradients; only the order of floating-point sums may differ."""
POLICIES = ("gpt2-bpe", "llama-char")


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """llama-char after 25 SFT steps: some answers well-formed, some not, so rewards vary
    within groups and every round has gradients to get wrong."""
    out = tmp_path_factory.mktemp("warm") / "llama-char"
    subprocess.run(
        [sys.executable, "-m", "mutualrl.cli", "sft", "--preset", "llama-char", "--regime",
         "short", "--steps", "25", "--batch", "16", "--lr", "3e-3", "--eval-every", "0",
         "--seed", "0", "--cache-dir", str(out.parent / "presets"), "--out", str(out),
         "--no-progress"], check=True, env={**os.environ, **_env()}, capture_output=True,
        timeout=600)
    return out


def _config(tmp_path: Path, warm: Path, run_id: str, nnodes: int, nproc: int,
            rounds: int = ROUNDS) -> dict[str, Any]:
    cfg = up_config(tmp_path, run_id, rounds, deadline_seconds=5.0)
    cfg["trainer"]["policies"][1]["sft_checkpoint"] = str(warm)
    cfg["trainer"]["task"]["format_reward"] = 0.5
    cfg["trainer"]["exchange"] = {"mode": "deterministic"}
    cfg["trainer"]["checkpoint"] = {"every": 1, "keep": 2}
    cfg["trainer"]["policies"][1].update(nnodes=nnodes, nproc=nproc)
    return cfg


def _env() -> dict[str, str]:
    return {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _params(ckpt: Path) -> dict[str, Any]:
    """A checkpoint's parameters: the gathered policy of a sharded one, else the state file."""
    import torch
    from safetensors.torch import load_file

    if (ckpt / "policy" / "model.safetensors").exists():
        return load_file(ckpt / "policy" / "model.safetensors")
    return dict(torch.load(ckpt / "state.pt", map_location="cpu", weights_only=False)["model"])


def _max_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert set(a) == set(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _check_sharing(run_dir: Path, summary: dict[str, Any], rounds: int) -> None:
    for name in POLICIES:
        assert [r["round"] for r in metrics_rows(run_dir, name)] == list(range(rounds)), name
        assert summary["results"][name]["records_taken"] > 0, summary["results"][name]
    stats = summary["see_stats"]["matrix"]["REWARD_STATS"]
    assert {t: set(s) for t, s in stats.items()} == {"gpt2-bpe": {"llama-char"},
                                                     "llama-char": {"gpt2-bpe"}}


def test_two_nodes_train_what_one_node_trains_and_share_both_ways(tmp_path: Path,
                                                                  warm: Path) -> None:
    finals = {}
    for run_id, nnodes, nproc in (("nodes", 2, 1), ("one-node", 1, 2)):
        path = write_yaml(tmp_path / f"{run_id}.yaml",
                          _config(tmp_path, warm, run_id, nnodes, nproc))
        run_dir = tmp_path / "runs" / run_id
        summary, _ = run_up(path, run_dir, timeout=1000, env=_env())
        _check_sharing(run_dir, summary, ROUNDS)
        final = f"round-{ROUNDS:06d}"
        finals[run_id] = {p: _params(run_dir / p / "checkpoints" / final) for p in POLICIES}
        manifest = json.loads((run_dir / "llama-char" / "checkpoints" / final /
                               "checkpoint.json").read_text())
        assert manifest["world"] == 2 and manifest["dcp"] is True
    logs = tmp_path / "runs" / "nodes" / "logs"
    assert (logs / "trainer-llama-char.log").exists()
    assert (logs / "trainer-llama-char-node1.log").exists()
    start = _params(tmp_path / "runs" / "nodes" / "llama-char" / "checkpoints" /
                    f"round-{ROUNDS - 1:06d}")
    assert _max_diff(finals["nodes"]["llama-char"], start) > 20 * ATOL  # the last step moved
    for name in POLICIES:
        assert _max_diff(finals["nodes"][name], finals["one-node"][name]) <= ATOL, name


def _wait(predicate: Any, proc: subprocess.Popen[str], what: str, within: float = 400) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert proc.poll() is None, f"up exited ({proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} after {within:.0f}s"
        time.sleep(0.2)


def test_a_dead_node_restarts_its_policy_from_the_latest_checkpoint(tmp_path: Path,
                                                                    warm: Path) -> None:
    rounds = 6
    cfg = _config(tmp_path, warm, "node-dies", 2, 1, rounds=rounds)
    cfg["up"].update(restart="on-failure", max_restarts=1)
    path = write_yaml(tmp_path / "dies.yaml", cfg)
    run_dir = tmp_path / "runs" / "node-dies"
    metrics = run_dir / "llama-char" / "metrics.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"} | _env()
    proc = subprocess.Popen([sys.executable, "-m", "mutualrl.cli", "up", "-c", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=tmp_path)
    try:
        _wait(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 2, proc,
              "two llama-char rounds", within=1200)
        node1 = json.loads((run_dir / "up.json").read_text())["pids"]["trainer-llama-char-node1"]
        os.kill(node1, signal.SIGKILL)  # the launcher alone: its rank dies with it
        out, _ = proc.communicate(timeout=1200)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=120)
    assert proc.returncode == 0, out[-4000:]
    assert "restarting trainer-llama-char (1/1)" in out
    # Rank 0 (on either node: the rendezvous numbers them) logs the resume.
    logs = "".join((run_dir / "logs" / f"trainer-llama-char{n}.log").read_text()
                   for n in ("", "-node1"))
    assert "resumed llama-char from" in logs, logs[-3000:]
    summary = json.loads((run_dir / "results.json").read_text())
    _check_sharing(run_dir, summary, rounds)  # each round once, though some ran twice
    assert (run_dir / "llama-char" / "checkpoints" / f"round-{rounds:06d}" / "dcp").is_dir()

