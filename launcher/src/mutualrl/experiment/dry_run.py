"""`mutualrl experiment --dry-run`: the grid and its ETA, then the memory plan of every policy
of every regime (the trainer's `mutualrl train --dry-run`, on the trainer section each run of
the regime gets)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.markup import escape

from mutualrl.experiment.config import ExperimentConfig
from mutualrl.experiment.plan import build_plan, fmt_duration, run_trainer_section


def dry_run(cfg: ExperimentConfig, console: Console, device_memory_gb: float | None,
            prompt_tokens: int | None, out: Path) -> int:
    """Print each regime's plans; 2 when a policy does not fit (the message names the fields),
    0 otherwise. Runs of a regime differ only in probe and seed, which the plan does not read."""
    from mutualrl.trainer.cli.dry_run import memory_plans
    from mutualrl.trainer.config.run import TrainerConfig

    plan = build_plan(cfg, out)
    grid = "; ".join(f"{r}: {', '.join(cfg.regime_probes(r))}" for r in cfg.active_regimes())
    print(f"{cfg.name}: {grid} x seeds {cfg.seeds} = {len(plan.runs)} runs, "
          f"{cfg.parallel_runs} at a time; ETA of the runs {fmt_duration(plan.eta_s)} "
          f"(+ {len(plan.warm_starts)} warm starts); time budget of the runs "
          f"{fmt_duration(cfg.time_budget_s) if cfg.time_budget_s else 'none'}")
    failed = False
    for regime, spec in cfg.active_regimes().items():
        probe = cfg.regime_probes(regime)[0]
        section = run_trainer_section(cfg, regime, spec, probe, cfg.seeds[0],
                                      f"{cfg.run_prefix}-dry", out / "runs", {})
        tcfg = TrainerConfig.model_validate(section)
        try:
            plans = memory_plans(tcfg, None, device_memory_gb, prompt_tokens,
                                 cache_dir=out / "runs" / "presets")
        except (ValueError, OSError) as e:
            console.print(f"[red]regime {escape(regime)}: {escape(str(e))}[/]")
            return 2
        print(f"regime {regime}:")
        for p in plans:
            print(p.text)  # plain: aligned columns, no wrapping
            if not p.plan.fits:
                failed = True
                console.print(f"[red]regime {escape(regime)}, policy {escape(p.policy)} does "
                              "not fit: " + escape("; ".join(p.plan.problems)) + "[/]")
    return 2 if failed else 0
