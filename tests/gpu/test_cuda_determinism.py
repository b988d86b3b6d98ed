"""On a CUDA machine: the deterministic mode's kernel settings make a policy's run on the GPU a
function of its seed. Two processes of one seed (HF rollouts sampled on the GPU, the update in
bf16 autocast over float32 master weights) write the same metrics, timings aside, and end with
the same parameters, bit for bit; another seed differs. Each run is its own process, so cuBLAS
reads the workspace setting before its first handle, as in a trainer.

The exchange's part of the mode (what a round reads from its peers) is the same code on any
device and is pinned by tests/e2e/test_determinism.py; this run has no peers
(`services.local`). Skipped without CUDA."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

if not torch.cuda.is_available():  # pragma: no cover - the CPU machines skip here
    pytest.skip("needs a CUDA device", allow_module_level=True)

ROUNDS = 4

# One run: build the session, train, save the final parameters (argv[3]) on the CPU.
RUN = """
import json, sys, torch
from pathlib import Path
from mutualrl.trainer.config.run import TrainerConfig
from mutualrl.trainer.runtime.loop import train
from mutualrl.trainer.runtime.session import build_session
cfg = TrainerConfig.model_validate(json.loads(sys.argv[1]))
s = build_session(cfg, "A", cache_dir=Path(sys.argv[2]))
train(s)
torch.save({k: v.detach().cpu() for k, v in s.model.state_dict().items()}, sys.argv[3])
s.close()
"""


def _run(tmp: Path, seed: int, tag: str) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor]]:
    out = tmp / tag
    cfg = {
        "run_id": "cuda-det", "seed": seed, "output_dir": str(out),
        "services": {"local": True},
        "exchange": {"mode": "deterministic", "staleness": 0},
        "grpo": {"group_size": 8, "prompts_per_round": 8, "rounds": ROUNDS, "lr": 1e-2,
                 "max_new_tokens": 12},
        "task": {"format_reward": 0.5},
        "eval": {"every": 0}, "checkpoint": {"every": 0},
        "metrics": {"tensorboard": False, "progress": False},
        "policies": [{"name": "A", "preset": "llama-char", "device": "cuda:0",
                      "dtype": "float32", "compute_dtype": "bfloat16"}],
    }
    params = out / "params.pt"
    subprocess.run([sys.executable, "-c", RUN, json.dumps(cfg), str(tmp / "presets"),
                    str(params)], check=True, timeout=600)
    rows = [json.loads(x) for x in (out / "cuda-det" / "A" / "metrics.jsonl").read_text()
            .splitlines()]
    return rows, torch.load(params)


def test_one_seed_one_run_on_the_gpu(tmp_path: Path) -> None:
    from mutualrl.trainer.runtime.determinism import comparable

    (rows, params), (rows2, params2), (rows_other, params_other) = (
        _run(tmp_path, 0, "first"), _run(tmp_path, 0, "second"), _run(tmp_path, 1, "other"))
    assert [r["round"] for r in rows] == list(range(ROUNDS))
    kept = [comparable(r) for r in rows]
    assert kept == [comparable(r) for r in rows2]
    assert all(torch.equal(params[k], params2[k]) for k in params)
    assert kept != [comparable(r) for r in rows_other]
    assert not all(torch.equal(params[k], params_other[k]) for k in params)
