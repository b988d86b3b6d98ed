"""The trainer's commands: `mutualrl sft`, `export`, `train`, `create-run` and `eval`.

`register` declares every command and its arguments and nothing more: each handler lives in
its own module (`cli.sft`, `cli.export`, `cli.train`, `cli.evaluate`), imported by name when
its command runs (`_handler`), so `mutualrl --help` loads neither pydantic nor torch while the
handler modules import what they use at their top.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from mutualrl.common.commands import Commands, Handler
from mutualrl.common.flags import deferred_flags

# Flags that SFTConfig's derived names (`--out-dir`, `--task.regime`, ...) also answer to.
SFT_FLAG_ALIASES = {"out_dir": ["--out"], "strong_skills": ["--strong"],
                    "task.regime": ["--regime"], "task.skills": ["--skills"]}


def _handler(name: str) -> Handler:
    """The function `run` of `mutualrl.trainer.cli.<name>`, imported when the command runs."""

    def run(args: argparse.Namespace) -> int:
        module = importlib.import_module(f"mutualrl.trainer.cli.{name}")
        return int(module.run(args))

    return run


def register(commands: Commands) -> None:
    """Add the trainer's commands to the `mutualrl` CLI."""
    p = commands.add(("sft",), "Warm-start a policy by SFT (strong skills, tiny weak pool); "
                     "every SFTConfig field is a flag, over the config file's value.",
                     _handler("sft"), deferred=deferred_flags(
                         "mutualrl.trainer.config.sft", "SFTConfig", aliases=SFT_FLAG_ALIASES))
    p.add_argument("-c", "--config", help="YAML: SFTConfig fields, or a run YAML's `sft:`.")

    e = commands.add(("export",), "Write a trained policy as a save_pretrained directory "
                     "(LoRA adapters merged) that transformers / SGLang / vLLM load.",
                     _handler("export"))
    e.add_argument("--run", required=True,
                   help="Run directory (<output_dir>/<run_id>) or run id under --output-dir.")
    e.add_argument("--policy", required=True, help="Policy name.")
    e.add_argument("--round", type=int, default=None,
                   help="Checkpoint after this many rounds (default: the latest).")
    e.add_argument("--out", type=Path, required=True, help="Output directory (new or empty).")
    e.add_argument("--output-dir", type=Path, default=Path("runs"),
                   help="Where run ids are looked up (the trainer's output_dir).")
    e.add_argument("--overwrite", action="store_true", help="Write into a non-empty --out.")

    t = commands.add(("train",), "Train one policy of a run (GRPO + its sharing probe).",
                     _handler("train"))
    t.add_argument("-c", "--config", required=True, help="Run YAML with a `trainer:` section.")
    t.add_argument("--policy", default=None,
                   help="Which of the config's policies this process trains.")
    t.add_argument("--resume", action="store_true",
                   help="Continue from the latest checkpoint of this policy, if any.")
    t.add_argument("--rounds", type=int, default=None, help="Override grpo.rounds.")
    t.add_argument("--dry-run", action="store_true",
                   help="Print each policy's memory plan (from model configs only) and exit; "
                        "exit 2 when a policy does not fit its device.")
    t.add_argument("--device-memory-gb", type=float, default=None,
                   help="Device size for --dry-run in GiB (default: the CUDA device's, or "
                        "host RAM for CPU policies).")
    t.add_argument("--prompt-tokens", type=int, default=None,
                   help="Prompt length per rollout for --dry-run (default: each policy's "
                        "longest rendered prompt of the task and benchmarks).")
    t.add_argument("--nproc", type=int, default=None,
                   help="Data-parallel ranks for this policy (overrides the policy's nproc): "
                        "started by torchrun's elastic launcher, FSDP2 over gloo (CPU) or NCCL.")
    t.add_argument("--nnodes", type=int, default=None,
                   help="Machines this policy trains on (overrides the policy's nnodes), "
                        "`--nproc` ranks on each; start `mutualrl train` once per machine.")
    t.add_argument("--node-rank", default=None,
                   help="This machine's place among the policy's nodes, 0..nnodes-1 (default "
                        "MUTUALRL_NODE_RANK, else 0); node 0 serves the rendezvous.")
    t.add_argument("--rdzv-endpoint", default=None,
                   help="host:port of node 0's rendezvous (overrides the policy's "
                        "rdzv_endpoint; default MUTUALRL_RDZV_ENDPOINT).")

    r = commands.add(("create-run",), "Create a run config's run in SEE with the run's secret "
                     "(trainers holding a policy token may not create it).",
                     _handler("create_run"))
    r.add_argument("-c", "--config", required=True, help="Run YAML with a `trainer:` section.")

    v = commands.add(("eval",), "Evaluate one policy on the config's eval.benchmarks (avg@n, "
                     "pass@k per skill) and write JSON; needs no services.",
                     _handler("evaluate"))
    v.add_argument("-c", "--config", type=Path, required=True, help="The run YAML.")
    v.add_argument("--policy", required=True, help="Policy name.")
    which = v.add_mutually_exclusive_group()
    which.add_argument("--checkpoint", type=int, default=None,
                       help="The policy's checkpoint after N rounds of this run.")
    which.add_argument("--latest", action="store_true", help="Its latest checkpoint.")
    which.add_argument("--model", type=Path, default=None,
                       help="A save_pretrained model directory (default: the policy's start).")
    v.add_argument("--out", type=Path, default=None,
                   help="JSON path (default <output_dir>/<run_id>/<policy>/eval-<which>.json).")
