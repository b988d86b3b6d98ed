"""`mutualrl up`."""

from __future__ import annotations

import argparse
from pathlib import Path

from mutualrl.common.commands import Commands


def _up(args: argparse.Namespace) -> int:
    import sys

    from rich.console import Console

    from mutualrl.launch.up import run_up

    # Piped into a file or CI log, rich would assume 80 columns and squeeze the tables.
    console = Console() if sys.stdout.isatty() else Console(width=120)
    return run_up(Path(args.config), console, fresh=args.fresh)


def register(commands: Commands) -> None:
    p = commands.add(["up"], "Run Redis, SEE, THL, MWRA and one trainer per policy of a run "
                     "config as supervised local processes.", _up)
    p.add_argument("-c", "--config", required=True, help="Run YAML (e.g. configs/demo.yaml).")
    p.add_argument("--fresh", action="store_true",
                   help="Start the run again from round 0: delete its checkpoints, metrics, "
                        "results and its records in SEE first. Without it, `up` of a run that "
                        "has checkpoints resumes every policy from its latest one.")
