"""Trainer commands: `mutualrl sft` (warm start); `train` and `create-run` register here too.

Heavy imports (torch, transformers) happen inside the handlers so `mutualrl --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mutualrl.common.commands import Commands
from mutualrl.common.flags import deferred_flags

# Flags that SFTConfig's derived names (`--out-dir`, `--task-regime`, ...) also answer to.
SFT_FLAG_ALIASES = {"out_dir": ["--out"], "strong_skills": ["--strong"],
                    "task.regime": ["--regime"], "task.skills": ["--skills"]}


def _sft(args: argparse.Namespace) -> int:
    from mutualrl.common.config import deep_merge, load_yaml
    from mutualrl.common.flags import flag_values
    from mutualrl.trainer.config.sft import SFTConfig
    from mutualrl.trainer.runtime.sft import EVAL_FILE, run_sft

    data: dict[str, Any] = {}
    if args.config:
        raw = load_yaml(args.config)
        # Either a dedicated SFT file or an `sft:` section of a run YAML.
        data = dict(raw.get("sft", raw))
    flags = flag_values(args, SFTConfig)
    if "model_path" in flags:
        data["preset"] = None  # a model path replaces the default preset
    cfg = SFTConfig.model_validate(deep_merge(data, flags))
    out = run_sft(cfg)
    report = json.loads((out / EVAL_FILE).read_text())
    print(json.dumps({"checkpoint": str(out), "heldout_accuracy": report["heldout_accuracy"],
                      "train_seconds": report["train_seconds"]}, indent=2))
    return 0


def _export(args: argparse.Namespace) -> int:
    import sys

    from mutualrl.trainer.runtime.export import ExportError, export, find_checkpoint

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
    p = commands.add(("sft",), "Warm-start a policy by SFT (strong skills, tiny weak pool); "
                     "every SFTConfig field is a flag, over the config file's value.", _sft,
                     deferred=deferred_flags("mutualrl.trainer.runtime.sft", "SFTConfig",
                                             aliases=SFT_FLAG_ALIASES))
    p.add_argument("-c", "--config", help="YAML: SFTConfig fields, or a run YAML's `sft:`.")

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

    # ---- `mutualrl train`, `mutualrl create-run` and `mutualrl eval` are registered below ----
    from mutualrl.trainer.cli.evaluate import register_eval_command
    from mutualrl.trainer.cli.train import register_train_commands

    register_train_commands(commands)
    register_eval_command(commands)
