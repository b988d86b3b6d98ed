"""`mutualrl bench shape`: training rounds of one policy at a real model's shape (`bench.shapes`,
random init), through the product's own loop, against its memory plan.

- The run: float32 master weights, bf16 compute, activation checkpointing, 16,384-token
  micro-batches and 2,048-token logit chunks, `prompts` x `group` rollouts of `new_tokens` on
  the synthetic task (the tokenizer holds ASCII, so prompts and answers tokenize), the HF
  engine as `policies[].hf` sets it (by default its fast path), no services.
- Per round: the round's time, its rollouts' time and share (the target: rollouts no more than
  half a round), rollout tokens/s, and the device's peak allocated and reserved memory so far.
- The plan: `mutualrl train --dry-run`'s plan of the same config, with the longest rendered
  prompt of the round's problems, against `torch.cuda.max_memory_allocated` over the rounds
  (the target: within 10%), and reserved against allocated (the allocator's
  `expandable_segments` keeps them close).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mutualrl.bench.shapes import SHAPES, build


def trainer_config(model_dir: Path, out: Path, device: str, prompts: int, group: int,
                   new_tokens: int, rounds: int, hf: dict[str, Any],
                   max_off_policy_steps: int = 0) -> dict[str, Any]:
    return {
        "run_id": "bench-shape", "seed": 0, "output_dir": str(out / "runs"),
        "services": {"local": True},
        "grpo": {"group_size": group, "prompts_per_round": prompts, "rounds": rounds,
                 "lr": 1e-6, "max_new_tokens": new_tokens, "beta": 0.0, "grad_clip": 1.0,
                 "micro_batch_tokens": 16384, "logit_chunk_tokens": 2048,
                 "activation_checkpointing": True,
                 "max_off_policy_steps": max_off_policy_steps},
        "task": {"format_reward": 0.5}, "eval": {"every": 0}, "checkpoint": {"every": 0},
        "metrics": {"tensorboard": False, "progress": False},
        "policies": [{"name": "p", "model_path": str(model_dir), "device": device,
                      "dtype": "float32", "compute_dtype": "bfloat16", "hf": hf,
                      "rollout_worker": max_off_policy_steps > 0}],
    }


def run_shape(shape: str = "qwen2.5-1.5b", device: str = "cuda", rounds: int = 3,
              prompts: int = 32, group: int = 8, new_tokens: int = 256,
              cache_dir: Path | None = None, hf: dict[str, Any] | None = None,
              progress: Callable[[dict[str, Any]], None] | None = None,
              max_off_policy_steps: int = 0) -> dict[str, Any]:
    """The figures of one run (see the module docstring); `progress` gets them after each
    round. `max_off_policy_steps` >= 1: the rollouts run in a rollout worker beside the update
    (`rollout_s` is then the learner's wait for them, `generate_s` the worker's sampling)."""
    import torch

    from mutualrl.trainer.cli.dry_run import memory_plans
    from mutualrl.trainer.config.run import TrainerConfig
    from mutualrl.trainer.runtime.loop import run_round
    from mutualrl.trainer.runtime.memory import GIB, set_allocator
    from mutualrl.trainer.runtime.session import build_session

    cuda = device.startswith("cuda")
    if cuda:
        set_allocator()
    load0 = os.getloadavg()
    cache = cache_dir or Path(tempfile.mkdtemp(prefix="mutualrl-bench-shape-"))
    model_dir = cache / f"model-{shape}"
    t = time.perf_counter()
    if not (model_dir / "config.json").exists():
        model, tok = build(shape, cache, device="cuda" if cuda else "cpu")
        model.to(torch.bfloat16).save_pretrained(model_dir)  # half the bytes to write
        tok.save_pretrained(model_dir)
        del model
    build_s = time.perf_counter() - t
    cfg = TrainerConfig.model_validate(trainer_config(model_dir, cache, device, prompts, group,
                                                      new_tokens, rounds, hf or {},
                                                      max_off_policy_steps))
    t = time.perf_counter()
    s = build_session(cfg, "p", cache_dir=cache)
    session_s = time.perf_counter() - t
    try:
        longest = max(len(r) for r in s.render(s.task.round_prompts(0, prompts, cfg.seed)))
        size = (torch.cuda.get_device_properties(torch.device(device).index or 0).total_memory
                if cuda else None)
        plan = memory_plans(cfg, device_memory_gb=size / GIB if size else None,
                            prompt_tokens=longest)[0]
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        rows: list[dict[str, float]] = []

        def figures() -> dict[str, Any]:
            later = rows[1:] or rows  # round 0 captures the graphs
            out: dict[str, Any] = {
                "benchmark": "shape", "shape": shape, "device": device,
                "device_name": torch.cuda.get_device_name(0) if cuda else "cpu",
                "torch": torch.__version__, "params": plan.shape.params,
                "rollouts": prompts * group, "new_tokens": new_tokens,
                "prompt_tokens": longest, "build_s": build_s, "session_s": session_s,
                "complete": len(rows) == rounds, "rounds": rows,
                "max_off_policy_steps": max_off_policy_steps,
                **{k: statistics.median(r[k] for r in later)
                   for k in ("step_s", "rollout_s", "rollout_share", "rollout_tokens_per_s",
                             "generate_s", "update_s")},
                "engine": s.engine.stats(),
                "plan_text": plan.text, "plan_fits": plan.plan.fits,
                "plan_items_gib": {k: v / GIB for k, v in plan.plan.items.items()},
                "plan_rollout_peak_gib": plan.plan.rollout_peak / GIB,
                "plan_train_peak_gib": plan.plan.train_peak / GIB,
                "sample_weights": plan.inputs.hf_weights,
                "allocator": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                "load_start": list(load0), "load_end": list(os.getloadavg()),
            }
            if cuda:
                planned = max(plan.plan.rollout_peak, plan.plan.train_peak) / GIB
                measured = max(r["max_alloc_gib"] for r in rows)
                reserved = max(r["max_reserved_gib"] for r in rows)
                out.update({"planned_peak_gib": planned, "measured_max_allocated_gib": measured,
                            "measured_max_reserved_gib": reserved,
                            "plan_over_measured": planned / measured,
                            "plan_within_10pct": abs(planned / measured - 1) <= 0.10,
                            "reserved_over_allocated": reserved / measured,
                            "rollouts_at_most_half": out["rollout_share"] <= 0.5})
            return out

        for k in range(rounds):
            m = run_round(s, k)
            row = {x: float(m[x]) for x in ("step_s", "rollout_s", "reward_mean", "generate_s",
                                            "update_s")}
            tokens = m["tokens_per_s"] * m["step_s"]
            row["rollout_share"] = m["rollout_s"] / m["step_s"]
            sampling = m["generate_s"] if max_off_policy_steps else m["rollout_s"]
            row["rollout_tokens_per_s"] = tokens / max(sampling, 1e-9)
            if cuda:
                row["max_alloc_gib"] = torch.cuda.max_memory_allocated() / GIB
                row["max_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
            rows.append(row)
            if progress:
                progress(figures())
        return figures()
    finally:
        s.close()


def write_run(shape: str, out: Path, device: str, prompts: int, group: int, new_tokens: int,
              hf: dict[str, Any]) -> Path:
    """The benchmark's run file at `shape` (`trainer_config`), its model a config without
    weights (`shapes.write_config`): what the memory plan of this shape reads."""
    import yaml

    from mutualrl.bench.shapes import write_config

    model = write_config(shape, out / "tokenizers", out / "model")
    cfg = trainer_config(model.resolve(), out.resolve(), device, prompts, group, new_tokens,
                         1, hf)
    path = out / "run.yaml"
    path.write_text(yaml.safe_dump({"trainer": cfg}, sort_keys=False))
    return path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", default=None, help="Write the result JSON here.")
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b",
                   help="Model shape (bench.shapes), random init.")
    p.add_argument("--device", default="cuda", help="The policy's device (cuda, cuda:1, cpu).")
    p.add_argument("--rounds", type=int, default=3, help="Training rounds.")
    p.add_argument("--prompts", type=int, default=32, help="grpo.prompts_per_round.")
    p.add_argument("--group", type=int, default=8, help="grpo.group_size.")
    p.add_argument("--new-tokens", type=int, default=256, help="grpo.max_new_tokens.")
    p.add_argument("--fast-path", choices=["true", "false"], default="true",
                   help="policies[].hf.fast_path (false: the dynamic-cache loop).")
    p.add_argument("--max-off-policy-steps", type=int, default=0,
                   help="d >= 1: rollouts in a rollout worker beside the update "
                        "(grpo.max_off_policy_steps; policies[].rollout_worker).")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="Where the model is built (default: a temporary directory).")
    p.add_argument("--write-run", type=Path, default=None, metavar="DIR",
                   help="Train nothing: write the shape's config and tokenizer (no weights) "
                        "to DIR/model and this run's file to DIR/run.yaml, for `mutualrl "
                        "train -c DIR/run.yaml --dry-run` (add --nproc, --nnodes).")
