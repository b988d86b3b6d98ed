"""The trainer with `rollout_engine: vllm` (runs in .venv-vllm: `make test-vllm`): a LoRA policy
whose engine serves the merged adapters after each round, `nproc: 2` with one engine per rank,
a trainer SIGKILLed mid-run that resumes with its engine serving the resumed weights, and a
rollout worker whose own vLLM engine serves each published version.

Plain GRPO (`services.local`) on llama-char; `format_reward` gives groups reward variance, so
every round moves the weights."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.timeout(600),
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                 reason="vLLM is not installed (make setup-vllm)")]

CLI = [sys.executable, "-m", "mutualrl.cli"]
FIXED = ["5;", "17;", "9;"]
PROMPTS = ["add:3+5=", "rev:71=", "add:4+5="]


def _cfg(out: Path, rounds: int, **policy: Any) -> dict[str, Any]:
    return {"trainer": {
        "run_id": "vllm", "output_dir": str(out), "services": {"local": True},
        "task": {"regime": "short", "skills": ["add", "rev"], "format_reward": 0.5},
        "grpo": {"group_size": 4, "prompts_per_round": 4, "rounds": rounds, "lr": 3e-3,
                 "max_new_tokens": 6, "ratio_to_behaviour": True},
        "eval": {"every": 0}, "checkpoint": {"every": 1, "keep": 5},
        "metrics": {"tensorboard": False, "progress": False},
        "policies": [{"name": "A", "preset": "llama-char", "rollout_engine": "vllm",
                      "vllm": {"kv_cache_gib": 0.1}, **policy}]}}


def _check_serves_trainer(s: Any, start: list[list[float]] | None = None) -> list[list[float]]:
    """The engine's log-probs of fixed sequences equal the trainer's own (float32), and differ
    from `start` (the weights before training) when given."""
    from mutualrl.trainer.model.batch import completion_logprobs, pack

    tok = s.tokenizer
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    fixed = [tok(t, add_special_tokens=False)["input_ids"] for t in FIXED]
    served = s.engine.score(prompts, fixed, s.cfg.grpo.temperature)
    with torch.no_grad():
        lp = completion_logprobs(s.model, pack(prompts, fixed, 0, torch.device("cpu")),
                                 s.cfg.grpo.temperature)
    mine = [lp[i, : len(f)].tolist() for i, f in enumerate(fixed)]
    diffs = [abs(a - b) for x, y in zip(served, mine, strict=True)
             for a, b in zip(x, y, strict=True)]
    assert max(diffs) <= 1e-3 and sum(diffs) / len(diffs) <= 1e-4, diffs
    if start is not None:
        assert max(abs(a - b) for x, y in zip(served, start, strict=True)
                   for a, b in zip(x, y, strict=True)) > 1e-3
    return served


def _starting_logprobs(s: Any, tmp: Path) -> list[list[float]]:
    """The fixed sequences' log-probs under the preset's starting weights."""
    from mutualrl.trainer.model.batch import completion_logprobs, pack
    from mutualrl.trainer.runtime.presets import ensure_preset, load_policy

    model, tok = load_policy(ensure_preset("llama-char", tmp / "presets"))
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    fixed = [tok(t, add_special_tokens=False)["input_ids"] for t in FIXED]
    with torch.no_grad():
        lp = completion_logprobs(model, pack(prompts, fixed, 0, torch.device("cpu")),
                                 s.cfg.grpo.temperature)
    return [lp[i, : len(f)].tolist() for i, f in enumerate(fixed)]


def _session(cfg: dict[str, Any], tmp: Path, resume: bool = False) -> Any:
    from mutualrl.trainer.config.run import TrainerConfig
    from mutualrl.trainer.runtime.session import build_session

    return build_session(TrainerConfig.model_validate(cfg["trainer"]), "A", resume=resume,
                         cache_dir=tmp / "presets")


def test_lora_policy_serves_merged_adapters_after_each_round(tmp_path: Path) -> None:
    from mutualrl.trainer.runtime.loop import run_round

    cfg = _cfg(tmp_path / "runs", 2, lora={"rank": 4, "alpha": 8,
                                           "target_modules": ["q_proj", "o_proj", "down_proj"]})
    s = _session(cfg, tmp_path)
    try:
        start = _check_serves_trainer(s)
        for k in range(2):
            m = run_round(s, k)
            # One step per round, ratio against vLLM's behaviour log-probs: exactly 1.
            assert m["clip_frac"] == 0.0 and abs(m["approx_kl"]) < 1e-6, m
        _check_serves_trainer(s, start)
    finally:
        s.engine.close()
        s.close()


def test_sigkilled_trainer_resumes_with_its_engine_serving_the_resumed_weights(
        tmp_path: Path) -> None:
    cfg = _cfg(tmp_path / "runs", 10_000)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    ckpts = tmp_path / "runs" / "vllm" / "A" / "checkpoints"
    log = (tmp_path / "train.log").open("wb")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([*CLI, "train", "-c", str(path), "--policy", "A"], stdout=log,
                            stderr=subprocess.STDOUT, env=env)
    def past_round_two() -> bool:
        # Rounds take tens of ms here and `keep: 5` prunes older checkpoints at once, so any
        # checkpoint of round >= 2 counts, not round-000002 itself.
        return any(int(c.name.split("-")[1]) >= 2 for c in ckpts.glob("round-*"))

    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and not past_round_two():
            assert proc.poll() is None, (tmp_path / "train.log").read_text()[-3000:]
            time.sleep(0.1)
        assert past_round_two(), (tmp_path / "train.log").read_text()[-3000:]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        log.close()
    s = _session(cfg, tmp_path, resume=True)
    try:
        assert s.start_round >= 2
        _check_serves_trainer(s, _starting_logprobs(s, tmp_path))  # not the starting weights
    finally:
        s.engine.close()
        s.close()


def test_two_ranks_each_run_an_engine(tmp_path: Path) -> None:
    """`mutualrl train --nproc 2`: each gloo rank samples its share of the prompts with its
    own vLLM engine, synced from the gathered FSDP2 model after every step."""
    cfg = _cfg(tmp_path / "runs", 2)
    path = tmp_path / "dp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([*CLI, "train", "-c", str(path), "--policy", "A", "--nproc", "2"],
                          capture_output=True, text=True, env=env, timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "runs" / "vllm" / "A" / "metrics.jsonl")
            .read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1]
    for r in rows:  # each rank's engine served the weights both ranks hold
        assert r["clip_frac"] == 0.0 and abs(r["approx_kl"]) < 1e-6, r


@pytest.mark.parametrize("d", [0, 1])
def test_a_rollout_worker_samples_with_its_own_vllm_engine(tmp_path: Path, d: int) -> None:
    """`rollout_worker: true` with `rollout_engine: vllm`: the worker process builds its own
    vLLM engine and loads each published version through it. With d = 0 round k samples the
    version its update starts from, so the ratio to vLLM's behaviour log-probs is exactly 1;
    with d = 1 (deterministic) round k samples version k - 1 and the lag is corrected."""
    from mutualrl.trainer.runtime.loop import run_round

    cfg = _cfg(tmp_path / "runs", 3, rollout_worker=True)
    cfg["trainer"]["grpo"]["max_off_policy_steps"] = d
    cfg["trainer"]["exchange"] = {"mode": "deterministic"}
    s = _session(cfg, tmp_path)
    try:
        rows = [run_round(s, k) for k in range(3)]
        worker = s.rollouts.worker
        assert worker is not None and worker.proc.is_alive() and worker.pid != os.getpid()
    finally:
        s.engine.close()
        s.close()
    assert [r["rollout_workers"] for r in rows] == [1.0, 1.0, 1.0]
    assert [r["policy_version"] for r in rows] == [max(0, k - d) for k in range(3)]
    if d == 0:
        for r in rows:  # the worker's engine served exactly the learner's weights
            assert r["clip_frac"] == 0.0 and abs(r["approx_kl"]) < 1e-6, r
    else:
        # round 1 samples version 0 but updates from version 1: a real lag, corrected
        assert rows[1]["off_policy_lag"] == 1.0
        assert abs(rows[1]["offpolicy/ratio_mean"] - 1.0) > 1e-6, rows[1]
