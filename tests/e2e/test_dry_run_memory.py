"""`mutualrl train --dry-run` against what the trainers then hold: for the e2e configs run through
`mutualrl up` (tiny_up's two presets; configs/gsm8k-chat-cpu.yaml's two chat policies), and for
a model of SmolLM2-135M's shape (random weights, one trainer), each policy's planned peak is
within 25% of its process's measured peak RSS (`peak_rss_mib`, getrusage). The plan counts the
micro-batch a round fills (rows x (prompt + max_new_tokens)), not `micro_batch_tokens`: on the
135M shape a 16,384-token micro-batch would be 20 GiB of activations where a round of 16 rows
holds 0.5 GiB."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from chat_policies import chat_policy, write_problems
from tiny_up import up_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1260)]
ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = 0.25
MIB = 1 << 20


def planned_peaks(config: Path, cwd: Path) -> dict[str, float]:
    """Each policy's planned peak (the larger phase) in MiB, from `mutualrl train --dry-run`
    run as a user runs it (its process measures the runtime share)."""
    proc = subprocess.run([sys.executable, "-m", "mutualrl.cli", "train", "-c", str(config),
                           "--dry-run"], capture_output=True, text=True, cwd=cwd, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    peaks: dict[str, float] = {}
    policy = ""
    for line in proc.stdout.splitlines():
        if m := re.match(r"policy (\S+): device", line):
            policy = m.group(1)
        elif m := re.match(r"\s+peak, (rollouts|training)\s+([0-9.]+) GiB", line):
            peaks[policy] = max(peaks.get(policy, 0.0), float(m.group(2)) * 1024)
        elif "rollouts of" in line and "prompt allowance" in line:
            raise AssertionError(f"the dry run did not render the problems: {line}")
    return peaks


def measured_peaks(run_dir: Path, policies: list[str]) -> dict[str, float]:
    return {p: max(json.loads(x)["peak_rss_mib"]
                   for x in (run_dir / p / "metrics.jsonl").read_text().splitlines())
            for p in policies}


def _check(name: str, planned: dict[str, float], measured: dict[str, float]) -> None:
    assert set(planned) == set(measured)
    lines = [f"{name}/{p}: planned {planned[p]:.0f} MiB, measured {measured[p]:.0f} MiB "
             f"({planned[p] / measured[p] - 1:+.1%})" for p in sorted(planned)]
    print("\n".join(lines))
    for p in planned:
        assert abs(planned[p] - measured[p]) <= TOLERANCE * measured[p], lines


def _up(config: Path, cwd: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    proc = subprocess.run([sys.executable, "-m", "mutualrl.cli", "up", "-c", str(config)],
                          capture_output=True, text=True, env=env, timeout=900, cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_tiny_up_config(tmp_path: Path) -> None:
    cfg = up_config(tmp_path, "rss-tiny", rounds=2)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    planned = planned_peaks(path, tmp_path)
    _up(path, tmp_path)
    policies = [p["name"] for p in cfg["trainer"]["policies"]]
    _check("tiny_up", planned, measured_peaks(tmp_path / "runs" / "rss-tiny", policies))


def test_gsm8k_chat_cpu_config(tmp_path: Path) -> None:
    cfg: dict[str, Any] = yaml.safe_load((ROOT / "configs/gsm8k-chat-cpu.yaml").read_text())
    tr = cfg["trainer"]
    tr["output_dir"] = str(tmp_path / "runs")
    tr["grpo"]["rounds"] = 2
    tr["eval"]["every"] = 2
    tr["task"]["dataset"]["path"] = str(write_problems(tmp_path / "train.parquet", 40))
    tr["eval"]["benchmarks"][0]["path"] = str(write_problems(tmp_path / "test.parquet", 6,
                                                             start=6))
    rewards = tr["task"]["rewards"]
    rewards[1]["fn"] = str(ROOT / rewards[1]["fn"])
    presets = tmp_path / "runs" / "presets"
    for policy, preset in zip(tr["policies"], ("gpt2-bpe", "llama-char"),
                              strict=True):
        policy["model_path"] = str(chat_policy(preset, presets, tmp_path / policy["name"]))
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    planned = planned_peaks(path, tmp_path)
    _up(path, tmp_path)
    policies = [p["name"] for p in tr["policies"]]
    _check("gsm8k-chat-cpu", planned, measured_peaks(tmp_path / "runs" / tr["run_id"],
                                                     policies))


def test_a_135m_model_shape(tmp_path: Path) -> None:
    """SmolLM2-135M's shape (30 layers, hidden 576, 49,152 vocabulary, tied) with random
    weights and a character tokenizer: the model's own terms (weights, gradients, AdamW's
    moments, activations, logits) are 2.5 GiB of the 3 GiB."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from mutualrl.thl.tokenizers import load_tokenizer
    from mutualrl.trainer.runtime.presets import ensure_preset

    tok = load_tokenizer(ensure_preset("llama-char", tmp_path / "presets"))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
        tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    model.save_pretrained(tmp_path / "smol")
    tok.save_pretrained(tmp_path / "smol")
    del model
    cfg = {"trainer": {
        "run_id": "rss-smol", "output_dir": str(tmp_path / "runs"),
        "task": {"regime": "short", "skills": ["add", "rev"], "heldout_per_skill": 8},
        "grpo": {"group_size": 4, "prompts_per_round": 4, "rounds": 2, "max_new_tokens": 16},
        "eval": {"every": 0}, "checkpoint": {"every": 1000},
        "metrics": {"tensorboard": False, "progress": False}, "services": {"local": True},
        "policies": [{"name": "smol", "model_path": str(tmp_path / "smol")}]}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    planned = planned_peaks(path, tmp_path)
    proc = subprocess.run([sys.executable, "-m", "mutualrl.cli", "train", "-c", str(path),
                           "--policy", "smol"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    measured = measured_peaks(tmp_path / "runs" / "rss-smol", ["smol"])
    assert measured["smol"] > 2500  # the model's terms dominate, as they do for real models
    _check("135m-shape", planned, measured)
