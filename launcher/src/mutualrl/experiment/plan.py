"""The experiment grid expanded into warm starts and runs, each with its exact config.

Pure: builds dictionaries (SFTConfig / TrainerConfig fields) and paths; nothing is started here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mutualrl.common import ids
from mutualrl.experiment.config import (
    ARM_POLICIES,
    ARM_SECTIONS,
    ExperimentConfig,
    RegimeSpec,
    config_hash,
    deep_merge,
)

# Fields the experiment owns in every run's `trainer:` section (a regime's `trainer:` may not
# set them: they are what makes the runs of a grid paired and separate).
_OWNED = ("run_id", "seed", "output_dir", "task", "services", "policies")


@dataclass(frozen=True)
class WarmStart:
    """One SFT warm start: which policy, with what config, written where."""

    regime: str
    policy: str
    seed: int
    sft: dict[str, Any]
    """SFTConfig fields (out_dir included)."""
    out_dir: Path

    @property
    def key(self) -> str:
        return f"{self.regime}/{self.policy}/s{self.seed}"


@dataclass
class RunSpec:
    """One cell of the grid: a run of every policy of `regime` under `probe` with `seed`."""

    regime: str
    probe: str
    seed: int
    run_id: str
    policies: list[str]
    rounds: int
    trainer: dict[str, Any]
    """The run's `trainer:` section without `services` (filled in when services are up)."""
    warm: dict[str, WarmStart]
    """policy -> its warm start."""
    eta_s: float
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ExperimentPlan:
    warm_starts: list[WarmStart]
    runs: list[RunSpec]

    @property
    def eta_s(self) -> float:
        return sum(r.eta_s for r in self.runs)


def warm_seed(cfg: ExperimentConfig, seed: int) -> int:
    """The SFT seed a run of `seed` starts from."""
    return seed if cfg.warm_start.per_seed else cfg.warm_start.seed


def sft_fields(regime: str, spec: RegimeSpec, policy_name: str, seed: int,
               preset_cache: Path) -> dict[str, Any]:
    """SFTConfig fields of one warm start (out_dir not set)."""
    pol = next(p for p in spec.policies if p.name == policy_name)
    base: dict[str, Any] = {"threads": 1, "progress": False}
    merged = deep_merge(deep_merge(base, spec.sft), pol.sft)
    merged.update(task=deep_merge(spec.task, merged.get("task") or {}),
                  strong_skills=list(pol.strong_skills), seed=seed,
                  cache_dir=str(preset_cache))
    if pol.preset is not None:
        merged.update(preset=pol.preset, model_path=None)
    else:
        merged.update(preset=None, model_path=str(pol.model_path))
    return merged


def build_plan(cfg: ExperimentConfig, out: Path, warm_dir: Path | None = None) -> ExperimentPlan:
    """Every warm start and run of the grid, runs ordered regime, seed, probe (so a stopped
    experiment has complete paired sets for the seeds it finished)."""
    warm_dir = warm_dir or cfg.warm_start.cache_dir or out / "warm_start"
    runs_dir = out / "runs"
    preset_cache = runs_dir / "presets"
    warm: dict[tuple[str, str, int], WarmStart] = {}
    by_key: dict[str, WarmStart] = {}  # equal SFT configs (across regimes) share a warm start
    runs: list[RunSpec] = []
    for regime, spec in cfg.active_regimes().items():
        bad = set(spec.trainer) & set(_OWNED)
        if bad:
            raise ValueError(f"regimes.{regime}.trainer must not set {sorted(bad)} "
                             "(the experiment sets them)")
        names = [p.name for p in spec.policies]
        for seed in cfg.seeds:
            ws = warm_seed(cfg, seed)
            for name in names:
                pol = next(p for p in spec.policies if p.name == name)
                if not pol.warm_start:
                    continue
                if (regime, name, ws) not in warm:
                    sft = sft_fields(regime, spec, name, ws, preset_cache)
                    # Keyed by content: a changed SFT config never reuses a stale checkpoint.
                    key = config_hash({k: v for k, v in sft.items()
                                       if k not in ("cache_dir", "progress", "out_dir")})
                    if key not in by_key:
                        d = cached_warm_start(warm_dir, key) or (
                            warm_dir / f"{regime}-{name}-s{ws}-{key}").resolve()
                        by_key[key] = WarmStart(regime, name, ws, {**sft, "out_dir": str(d)}, d)
                    warm[(regime, name, ws)] = by_key[key]
            for probe in cfg.regime_probes(regime):
                run_id = f"{cfg.run_prefix}-{regime}-{probe}-s{seed}"
                if not ids.RUN_ID.valid(run_id):
                    raise ValueError(f"run id {run_id!r} is not {ids.RUN_ID.described}: "
                                     "shorten or change run_prefix or the regime name")
                mine = {n: warm[(regime, n, ws)] for n in names if (regime, n, ws) in warm}
                trainer = run_trainer_section(cfg, regime, spec, probe, seed, run_id, runs_dir,
                                              {n: w.out_dir for n, w in mine.items()})
                rounds = int(trainer.get("grpo", {}).get("rounds", 300))
                sec = spec.seconds_per_round.get(probe, spec.default_seconds_per_round)
                runs.append(RunSpec(
                    regime=regime, probe=probe, seed=seed, run_id=run_id, policies=names,
                    rounds=rounds, trainer=trainer, warm=mine,
                    eta_s=(rounds * sec + spec.startup_seconds) / cfg.parallel_runs))
    return ExperimentPlan(warm_starts=list(by_key.values()), runs=runs)


def cached_warm_start(warm_dir: Path, key: str) -> Path | None:
    """A finished warm start of SFT config `key` in `warm_dir`, whichever regime and policy
    named its directory (a regime run on its own reuses one another regime made)."""
    done = sorted(d for d in warm_dir.glob(f"*-{key}") if (d / "sft_eval.json").exists())
    return done[0].resolve() if done else None


def run_trainer_section(cfg: ExperimentConfig, regime: str, spec: RegimeSpec, probe: str,
                        seed: int, run_id: str, runs_dir: Path,
                        checkpoints: dict[str, Path]) -> dict[str, Any]:
    """TrainerConfig fields of one run (services filled in later by the runner)."""
    t = deep_merge({"metrics": {"tensorboard": False, "progress": False},
                    "checkpoint": {"every": 0, "keep": 1}}, spec.trainer)
    arm = cfg.arm_fields(probe)
    kind = arm.pop("kind")
    every_policy = arm.pop(ARM_POLICIES, {})
    for section in ARM_SECTIONS:
        if section in arm:
            t[section] = deep_merge(t.get(section) or {}, arm.pop(section))
    probe_cfg = deep_merge(t.get("probe") or {}, spec.probe_overrides.get(kind, {}))
    probe_cfg = deep_merge(deep_merge(probe_cfg, arm), spec.probe_overrides.get(probe, {}))
    probe_cfg["kind"] = kind
    t["probe"] = probe_cfg
    t.update(run_id=run_id, seed=seed, output_dir=str(runs_dir.resolve()), task=dict(spec.task))
    t["policies"] = []
    for p in spec.policies:
        entry: dict[str, Any] = {"name": p.name, **deep_merge(p.trainer, every_policy)}
        if p.name in checkpoints:
            entry["sft_checkpoint"] = str(checkpoints[p.name])
        if p.preset is not None:
            entry["preset"] = p.preset
        else:
            entry["model_path"] = str(p.model_path)
        entry.setdefault("threads", 1)
        t["policies"].append(entry)
    return t


def fmt_duration(seconds: float) -> str:
    """'1h02m', '12m05s', '42s'."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"
