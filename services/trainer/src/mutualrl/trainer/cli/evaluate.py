"""`mutualrl eval -c CONFIG --policy NAME [--checkpoint N | --latest | --model DIR]`: one
policy's benchmarks (`eval.benchmarks`) alone, no services, written as JSON."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from mutualrl.trainer.config.run import TrainerConfig, first_error, load_trainer_config
from mutualrl.trainer.data.chat import renderer_for
from mutualrl.trainer.data.evaluation import run_benchmark
from mutualrl.trainer.data.task_factory import make_task
from mutualrl.trainer.engines.factory import make_engine
from mutualrl.trainer.runtime import checkpoint
from mutualrl.trainer.runtime.distributed import SINGLE
from mutualrl.trainer.runtime.export import ExportError, export, find_checkpoint
from mutualrl.trainer.runtime.preflight import benchmark_tasks, policy_dir
from mutualrl.trainer.runtime.presets import load_policy


def evaluate_policy(cfg: TrainerConfig, policy_name: str, model_dir: Path) -> dict[str, Any]:
    """Every benchmark of `cfg.eval` on the model in `model_dir`, rendered and scored as the
    policy's training run does."""
    cfg = cfg.for_policy(policy_name)
    policy = cfg.policy(policy_name)
    if not cfg.eval.benchmarks:
        raise ValueError("eval.benchmarks: the config lists no benchmark to evaluate")
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(policy.threads)
    model, tok = load_policy(model_dir, policy.dtype, policy.device)
    model.eval()
    render = renderer_for(tok, policy)
    task = make_task(cfg.task)
    engine = make_engine(policy.rollout_engine, model, tok, model_path=str(model_dir))
    max_new = cfg.grpo.max_new_tokens or task.max_new_tokens
    out: dict[str, Any] = {"policy": policy.name, "model": str(model_dir), "benchmarks": {}}
    t0 = time.perf_counter()
    with torch.no_grad():
        for bench, problems in benchmark_tasks(cfg, task, cfg.output_dir / "presets"):
            out["benchmarks"][bench.name] = run_benchmark(
                bench, problems, render, engine, SINGLE, max_new, cfg.probe.tau, cfg.seed)
    out["seconds"] = time.perf_counter() - t0
    return out


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load_trainer_config(args.config)
        policy = cfg.policy(args.policy)
    except ValidationError as err:
        print(f"mutualrl eval: {first_error(err)}", file=sys.stderr)
        return 2
    except ValueError as err:
        print(f"mutualrl eval: {err}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="mutualrl-eval-") as tmp:
        try:
            if args.model is not None:
                model_dir, label = args.model, "model"
            elif args.checkpoint is not None or args.latest:
                ckpt = find_checkpoint(cfg.run_dir(policy.name).parent, policy.name,
                                       args.checkpoint)
                model_dir = ckpt / checkpoint.POLICY_DIR
                if not model_dir.is_dir():  # a LoRA checkpoint: merged into its base first
                    model_dir = export(ckpt, Path(tmp) / "merged")
                label = f"round{checkpoint.round_of(ckpt)}"
            else:
                model_dir = policy_dir(policy, cfg.output_dir / "presets", cfg.seed)
                label = "start"
            result = evaluate_policy(cfg, policy.name, Path(model_dir))
        except (ExportError, ValueError, FileNotFoundError) as err:
            print(f"mutualrl eval: {err}", file=sys.stderr)
            return 2
    path = args.out or cfg.run_dir(policy.name) / f"eval-{label}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    print(json.dumps({**result, "out": str(path)}, indent=2))
    return 0
