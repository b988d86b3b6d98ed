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
    return run_up(Path(args.config), console)


def _bench_rounds(args: argparse.Namespace) -> int:
    import json

    from mutualrl.launch.bench import bench_rounds
    from mutualrl.launch.bench_probes import bench_probes

    out = Path(args.out) if args.out else None
    if args.probes:
        res = bench_probes(args.probes.split(","), args.modes.split(","), int(args.n),
                           args.rounds, args.slots, args.staleness, args.repeats, out)
    else:
        res = bench_rounds([int(n) for n in args.n.split(",")], args.rounds, args.slots, out,
                           short_pool=args.short_pool)
    text = json.dumps(res, indent=2)
    if args.json:
        Path(args.json).write_text(text)
    print(text)
    return 0


def register(commands: Commands) -> None:
    p = commands.add(["up"], "Run Redis, SEE, THL, MWRA and one trainer per policy of a run "
                     "config as supervised local processes.", _up)
    p.add_argument("-c", "--config", required=True, help="Run YAML (e.g. configs/demo.yaml).")
    commands.group(["bench"], "Benchmarks (each figure a ratio against an anchor).")
    b = commands.add(["bench", "rounds"], "Round time of N policies through `mutualrl up` on "
                     "fewer CPU units than policies, against their steps one after another.",
                     _bench_rounds)
    b.add_argument("--n", default="2,3,4", help="Comma-separated policy counts (2-4).")
    b.add_argument("--rounds", type=int, default=30, help="Rounds per run.")
    b.add_argument("--slots", type=int, default=2, help="CPU units MWRA's worker offers.")
    b.add_argument("--short-pool", default="auto", choices=["auto", "share", "time-share"],
                   help="MWRA's mwra.short_pool (time-share: the turns MWRA used to take).")
    b.add_argument("--probes", default=None, help="Comma-separated probes (e.g. none,sgt,prp): "
                   "their round times against GRPO's, same policies and seed (--n: one count).")
    b.add_argument("--modes", default="deterministic,asynchronous",
                   help="With --probes: the exchange modes to run.")
    b.add_argument("--staleness", type=int, default=1, help="With --probes: exchange.staleness.")
    b.add_argument("--repeats", type=int, default=1, help="With --probes: interleaved repeats.")
    b.add_argument("--out", default=None, help="Keep the runs here (default: a temp dir).")
    b.add_argument("--json", default=None, help="Write the result JSON here.")
