"""Trainer commands: `mutualrl sft` (warm start); `train` and `bench trainer` register here too.

Heavy imports (torch, transformers) happen inside the handlers so `mutualrl --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mutualrl.common.commands import Commands


def _sft(args: argparse.Namespace) -> int:
    from mutualrl.common.config import load_yaml
    from mutualrl.trainer.sft import EVAL_FILE, SFTConfig, run_sft

    data: dict[str, Any] = {}
    if args.config:
        raw = load_yaml(args.config)
        # Either a dedicated SFT file or an `sft:` section of a run YAML.
        data = dict(raw.get("sft", raw))
    flags = {
        "preset": args.preset, "model_path": args.model_path, "steps": args.steps,
        "lr": args.lr, "batch": args.batch, "seed": args.seed, "out_dir": args.out,
        "threads": args.threads, "weak_pool": args.weak_pool, "weak_share": args.weak_share,
        "eval_every": args.eval_every, "cache_dir": args.cache_dir,
    }
    if args.model_path is not None:
        data["preset"] = None  # a model path replaces the default preset
    data.update({k: v for k, v in flags.items() if v is not None})
    if args.strong:
        data["strong_skills"] = args.strong.split(",")
    if args.regime or args.skills:
        task = dict(data.get("task") or {})
        if args.regime:
            task["regime"] = args.regime
        if args.skills:
            task["skills"] = args.skills.split(",")
        data["task"] = task
    if args.no_progress:
        data["progress"] = False
    cfg = SFTConfig.model_validate(data)
    out = run_sft(cfg)
    report = json.loads((out / EVAL_FILE).read_text())
    print(json.dumps({"checkpoint": str(out), "heldout_accuracy": report["heldout_accuracy"],
                      "train_seconds": report["train_seconds"]}, indent=2))
    return 0


def _export(args: argparse.Namespace) -> int:
    import sys

    from mutualrl.trainer.export import ExportError, export, find_checkpoint

    try:
        ckpt = find_checkpoint(args.run, args.policy, args.round, args.output_dir)
        out = export(ckpt, args.out, overwrite=args.overwrite)
    except ExportError as e:
        print(f"mutualrl export: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"checkpoint": str(ckpt), "out": str(out)}, indent=2))
    return 0


def register(commands: Commands) -> None:
    """Add the trainer's commands to the `mutualrl` CLI."""
    p = commands.add(("sft",), "Warm-start a policy by SFT (strong skills, tiny weak pool).",
                     _sft)
    p.add_argument("-c", "--config", help="YAML: SFTConfig fields, or a run YAML's `sft:`.")
    p.add_argument("--preset", help="Built-in preset to start from (gpt2-bpe, llama-char, ...).")
    p.add_argument("--model-path", type=Path, help="Local model directory instead of a preset.")
    p.add_argument("--regime", choices=["short", "worked"], help="Task completion format.")
    p.add_argument("--skills", help="Comma-separated task skills (all are evaluated).")
    p.add_argument("--strong", help="Comma-separated strong skills (the rest are weak).")
    p.add_argument("--steps", type=int, help="Optimizer steps.")
    p.add_argument("--lr", type=float, help="AdamW learning rate.")
    p.add_argument("--batch", type=int, help="Examples per step.")
    p.add_argument("--weak-pool", type=int, help="Size of the fixed weak-skill pool.")
    p.add_argument("--weak-share", type=float, help="Share of examples from the weak pool.")
    p.add_argument("--eval-every", type=int, help="Evaluate every N steps (0: only at the end).")
    p.add_argument("--seed", type=int, help="Init, data and pool seed.")
    p.add_argument("--threads", type=int, help="torch threads.")
    p.add_argument("--cache-dir", type=Path, help="Preset cache directory.")
    p.add_argument("--out", type=Path, help="Checkpoint directory.")
    p.add_argument("--no-progress", action="store_true", help="No progress bar.")

    e = commands.add(("export",), "Write a trained policy as a save_pretrained directory "
                     "(LoRA adapters merged) that transformers / SGLang / vLLM load.", _export)
    e.add_argument("--run", required=True,
                   help="Run directory (<output_dir>/<run_id>) or run id under --output-dir.")
    e.add_argument("--policy", required=True, help="Policy name.")
    e.add_argument("--round", type=int, default=None,
                   help="Checkpoint after this many rounds (default: the latest).")
    e.add_argument("--out", type=Path, required=True, help="Output directory (new or empty).")
    e.add_argument("--output-dir", type=Path, default=Path("runs"),
                   help="Where run ids are looked up (the trainer's output_dir).")
    e.add_argument("--overwrite", action="store_true", help="Write into a non-empty --out.")

    # ---- `mutualrl train` and `mutualrl bench trainer` are registered below this line ----
    from mutualrl.trainer.eval_cli import register_eval_command
    from mutualrl.trainer.train_cli import register_train_commands

    register_train_commands(commands)
    register_eval_command(commands)
