"""`mutualrl experiment -c configs/probe-comparison.yaml --out DIR [--quick]`."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from mutualrl.common.commands import Commands


def _experiment(args: argparse.Namespace) -> int:
    from pydantic import ValidationError
    from rich.console import Console

    from mutualrl.experiment.config import load_experiment
    from mutualrl.experiment.runner import run_experiment
    from mutualrl.launch.exit_codes import EXIT_CONFIG

    console = Console(stderr=False, highlight=False)
    try:
        cfg, raw = load_experiment(args.config, quick=args.quick)
        if args.full:
            cfg = cfg.full()
        if args.seeds:
            cfg.seeds = [int(s) for s in args.seeds.split(",")]
        if args.probes:  # exactly these arms, in every regime that runs
            cfg = cfg.full().model_copy(update={"only_regimes": cfg.only_regimes})
            cfg.probes = args.probes.split(",")
        if args.regimes:
            cfg.only_regimes = args.regimes.split(",")
        if args.run_prefix:
            cfg.run_prefix = args.run_prefix
        if args.parallel_runs:
            cfg.parallel_runs = args.parallel_runs
        if args.time_budget_min:
            cfg.time_budget_s = args.time_budget_min * 60.0
        cfg = type(cfg).model_validate(cfg.model_dump())  # re-check the flags
    except (ValueError, OSError, ValidationError) as err:
        console.print(f"[red]config {args.config}: {err}[/]")
        return EXIT_CONFIG
    if args.dry_run:
        from mutualrl.experiment.dry_run import dry_run

        return dry_run(cfg, console, args.device_memory_gb, args.prompt_tokens,
                       Path(args.out or "runs/dry-run"))
    if not args.out:
        console.print("[red]--out is required (except with --dry-run)[/]")
        return EXIT_CONFIG
    if args.report_only:
        from mutualrl.experiment.runner import report_only

        return report_only(cfg, Path(args.out), console)
    return run_experiment(cfg, raw, Path(args.out), console, quick=args.quick,
                          warm_only=args.warm_start_only,
                          redis_url=os.environ.get("REDIS_URL") or None,
                          token=os.environ.get("MUTUALRL_AUTH_TOKEN") or None)


def register(commands: Commands) -> None:
    """Add `mutualrl experiment` to the CLI."""
    p = commands.add(("experiment",),
                     "Probe comparison: none / prp / xgrpo / sgt and SGT's controls (sgt-self, "
                     "oracle) over paired seeds and task regimes of 2 or more policies, through "
                     "SEE, THL and MWRA; writes results.json/.md and the plots.",
                     _experiment)
    p.add_argument("-c", "--config", required=True,
                   help="Experiment YAML (configs/probe-comparison.yaml).")
    p.add_argument("--out", help="Output directory (required except with --dry-run).")
    p.add_argument("--dry-run", action="store_true",
                   help="Print every regime's per-policy memory plan (model configs and the "
                        "rendered problems; no weights) and exit; exit 2 when a policy does not "
                        "fit its device.")
    p.add_argument("--device-memory-gb", type=float, default=None,
                   help="Device size for --dry-run in GiB (default: the CUDA device's).")
    p.add_argument("--prompt-tokens", type=int, default=None,
                   help="Prompt length per rollout for --dry-run (default: each policy's "
                        "longest rendered prompt of the task and benchmarks).")
    p.add_argument("--quick", action="store_true",
                   help="Merge the config's `experiment.quick` overrides (a reduced grid).")
    p.add_argument("--seeds", help="Comma-separated seeds (overrides the config).")
    p.add_argument("--full", action="store_true",
                   help="The whole grid: every regime runs every arm of `probes` (the default "
                        "runs each regime's `probes` subset and `only_regimes`).")
    p.add_argument("--probes", help="Comma-separated arms to run in every regime that runs "
                                    "(probe kinds, prp-seq, prp-chunk or configured arms).")
    p.add_argument("--regimes", help="Comma-separated regimes to run (default: the config's).")
    p.add_argument("--run-prefix", help="Prefix of every run id (unique per Redis).")
    p.add_argument("--parallel-runs", type=int, help="Runs trained at once.")
    p.add_argument("--time-budget-min", type=float,
                   help="Start no run that would end past this many minutes of runs.")
    p.add_argument("--report-only", action="store_true",
                   help="Only rebuild results.json/.md and curves.png from the runs in --out.")
    p.add_argument("--warm-start-only", action="store_true",
                   help="Only make (or check) the warm starts, then exit.")
