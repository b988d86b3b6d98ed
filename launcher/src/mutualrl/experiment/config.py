"""The `experiment:` section of a probe-comparison YAML (configs/probe-comparison.yaml).

An experiment is a grid: regimes x probes x seeds. Every cell is one run (its own run_id) of
the same heterogeneous policies through the same SEE / THL / MWRA; only the probe differs
between cells of a (regime, seed), and the seed fixes prompt order, init / warm start and
sampling, so probes are compared on paired seeds. Pure: no network, no torch (the probe kinds
come from the trainer's config schema, a leaf without either).
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, Field, ValidationError, model_validator

from mutualrl.common.config import Config, load_yaml
from mutualrl.trainer.config.run import PolicySettings, ProbeKind

PROBES: tuple[str, ...] = get_args(ProbeKind)
"""Probe kinds (ProbeSettings.kind)."""
CONTROL = "none"
HACPO_PAPER: dict[str, Any] = {
    "kind": "hacpo",
    # Own rows are GSPO with GSPO's clip radii, the round takes the recipe's four optimizer
    # steps (128 own and 128 peer prompts' rows in mini-batches of 64 prompts') so the stepwise
    # lower clip of peer ratios tightens, the loss is a mean over rows and every row's log
    # ratio is clamped to +-10 (the recipe's `compute_hacpo_loss`); peers are read in the
    # same round, so the capability-weighted baseline reaches own rows (docs/algorithms.md,
    # "As its paper runs it").
    "grpo": {"importance_sampling_level": "sequence", "eps_lo": 3e-4, "eps_hi": 4e-4,
             "mini_batches": 4, "aggregation": "sequence_mean", "max_log_ratio": 10.0},
    "exchange": {"staleness": 0},
}
ARMS: dict[str, dict[str, Any]] = {
    "prp-seq": {"kind": "prp", "prp_level": "sequence"},
    "prp-chunk": {"kind": "prp", "prp_level": "chunk"},
    "hacpo": HACPO_PAPER,
    "hacpo-naive": {**HACPO_PAPER, "kind": "hacpo-naive"},
    "hacpo-stale": {"kind": "hacpo"},
    "hacpo-nofloor": {**HACPO_PAPER, "hacpo_delta": 1.0, "hacpo_alpha": 0.0,
                      "hacpo_delta_step": 0.0},
    "hacpo-samelen": {**HACPO_PAPER, "hacpo_ratio_length": "learner"},
    "hacpo-grpo": {"kind": "hacpo", "exchange": {"staleness": 0}},
}
"""Built-in arms besides the probe kinds: PRP at either weight level; HACPO in its paper's
configuration (`hacpo`, `hacpo-naive`), the variant on the regime's own settings with the
peers' round before (`hacpo-stale`), and two ablations of the paper's: no lower clip and no
sg(s)^alpha factor (`hacpo-nofloor`), one length on both sides of the sequence ratio
(`hacpo-samelen`); and the paper's same-round joint baseline with own rows on the regime's
GRPO loss and one update a round (`hacpo-grpo`), which separates the baseline from GSPO's
settings. Besides ProbeSettings fields an arm may set `grpo` and `exchange` fields
(a method's own optimisation settings), merged over the regime's, and `policies` fields
(PolicySettings, e.g. `rollout_worker`) applied to every policy of the run."""
ARM_SECTIONS = ("grpo", "exchange")
"""Trainer sections an arm may set besides its ProbeSettings fields."""
ARM_POLICIES = "policies"
"""An arm's PolicySettings fields, merged over each policy's own (the regime's `trainer`)."""
POLICY_OWNED = ("name", "preset", "model_path", "sft_checkpoint")
"""PolicySettings fields that say which policy and model a run trains: the regime's and the
warm start's, never an arm's."""


class PolicySpec(Config):
    """One policy of every run of a regime, and how it is warm-started."""

    name: str = Field(pattern=r"^[A-Za-z0-9._-]{1,32}$")
    """Policy id (SEE records, MWRA, output paths, table rows)."""
    preset: str | None = None
    """Tiny built-in preset (mutualrl.trainer.runtime.presets); or give `model_path`."""
    model_path: Path | None = None
    """A local Hugging Face model directory (GPU config)."""
    strong_skills: list[str] = Field(default_factory=list)
    """Skills the warm start teaches; every other task skill is weak (starts near 0)."""
    warm_start: bool = True
    """False: no SFT warm start, RL starts from the model itself (real checkpoints)."""
    sft: dict[str, Any] = Field(default_factory=dict)
    """SFTConfig fields for this policy only (override the regime's `sft`)."""
    trainer: dict[str, Any] = Field(default_factory=dict)
    """Extra TrainerConfig policy fields (dtype, device, rollout_engine, threads)."""

    @model_validator(mode="after")
    def _one_source(self) -> PolicySpec:
        if (self.preset is None) == (self.model_path is None):
            raise ValueError(f"policy {self.name}: give exactly one of preset, model_path")
        if self.warm_start and not self.strong_skills:
            raise ValueError(f"policy {self.name}: a warm start needs strong_skills")
        return self


class RegimeSpec(Config):
    """A task regime: the policies, their warm start and the RL settings shared by all probes."""

    task: dict[str, Any] = Field(default_factory=dict)
    """TaskConfig fields (regime, skills, digits, held-out size)."""
    policies: list[PolicySpec] = Field(min_length=2)
    """The heterogeneous policies trained together in every run of this regime."""
    sft: dict[str, Any] = Field(default_factory=dict)
    """SFTConfig fields common to this regime's warm starts (steps, lr, weak pool...)."""
    trainer: dict[str, Any] = Field(default_factory=dict)
    """TrainerConfig fields common to every run of the regime (grpo, probe knobs, eval); the
    experiment sets run_id, seed, output_dir, task, services, policies and probe.kind."""
    probe_overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Per probe kind or arm: ProbeSettings fields that apply to it only (e.g. PRP's weight
    mode). A kind's overrides apply to every arm of that kind, an arm's on top. Knobs a probe
    does not read are inert, so shared knobs belong in `trainer.probe`."""
    probes: list[str] | None = None
    """The arms this regime runs by default (a subset of the experiment's `probes`); None: all.
    `--full` lifts it."""
    seconds_per_round: dict[str, float] = Field(default_factory=dict)
    """Expected wall seconds per round of a run (both policies at once) per probe, for the ETA;
    missing probes use `default_seconds_per_round`."""
    default_seconds_per_round: float = Field(0.6, gt=0)
    """ETA fallback (docs/science-notes.md: ~0.5 short, 0.6-1.0 worked)."""
    startup_seconds: float = Field(20.0, ge=0)
    """ETA: seconds a run spends starting its trainers (imports, model load, registration)."""

    @model_validator(mode="after")
    def _check(self) -> RegimeSpec:
        names = [p.name for p in self.policies]
        if len(set(names)) != len(names):
            raise ValueError(f"policy names must be unique, got {names}")
        return self


class WarmStartSettings(Config):
    """How warm starts are made and checked."""

    per_seed: bool = False
    """False: one warm start per (regime, policy), made with `seed` and reused by every seed
    (seeds then vary prompt order and sampling only). True: one per (regime, policy, seed),
    also varying the init."""
    seed: int = 0
    """SFT seed (init, data, weak pool) when `per_seed` is false."""
    cache_dir: Path | None = None
    """Where warm starts are kept (keyed by a hash of their SFT config, so an unchanged config
    reuses them across experiments); None: <out>/warm_start."""
    parallel: int = Field(2, ge=1)
    """Warm starts trained at once (one thread each)."""
    weak_max: float = Field(0.05, ge=0, le=1)
    """A weak skill starting above this accuracy is flagged (docs/science-notes.md: it must
    start near 0, else plain GRPO catches up on its own)."""
    strong_min: float = Field(0.5, ge=0, le=1)
    """A strong skill starting below this is flagged (nothing to share)."""


class ExperimentConfig(Config):
    """The `experiment:` section: the grid and how it is run."""

    name: str = Field("probe-comparison", pattern=r"^[A-Za-z0-9._-]{1,32}$")
    """Label of the experiment (in results.json and the tables)."""
    run_prefix: str = Field("pc", pattern=r"^[A-Za-z0-9._-]{1,24}$")
    """Run ids are <run_prefix>-<regime>-<probe>-s<seed>; a unique prefix keeps experiments
    apart in one Redis (the e2e test passes one)."""
    probes: list[str] = Field(default_factory=lambda: ["none", "prp", "xgrpo", "sgt"])
    """Arms compared: probe kinds (none, prp, xgrpo, sgt, sgt-self, oracle, hacpo, hacpo-naive,
    sapo, ftis), the built-in arms prp-seq / prp-chunk, or names defined in `arms`. `none`
    (plain GRPO) is the control every "− none" column is paired against."""
    arms: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Named arms: ProbeSettings fields with a `kind` (e.g. `prp-none: {kind: prp,
    prp_weight_mode: none}`), and optionally `grpo` and `exchange` fields merged over the
    regime's and `policies` fields (PolicySettings but name, preset, model_path,
    sft_checkpoint) over every policy's (e.g. `sgt-d1: {kind: sgt, grpo:
    {max_off_policy_steps: 1}, policies: {rollout_worker: true}}`); they join (and may
    replace) the built-in ones."""
    contrasts: list[tuple[str, str]] = Field(
        default_factory=lambda: [("sgt", "sgt-self"), ("oracle", "sgt"), ("sgt", "none")])
    """Paired differences reported as "a − b" when a regime ran both arms (SGT against its
    controls: SGT − sgt-self is what peer information adds; oracle − SGT what a perfect peer
    would add on top)."""
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    """Paired seeds: the same seed gives the same prompt order, warm start and sampling seed
    under every probe."""
    regimes: dict[str, RegimeSpec]
    """Task regimes by name (`short`, `worked`), each reported on its own."""
    only_regimes: list[str] | None = None
    """Run only these regimes (None: all); `--quick` uses it to shrink the grid."""
    parallel_runs: int = Field(1, ge=1)
    """Runs trained at once (each is two single-threaded trainer processes)."""
    worker_slots: int | None = Field(None, ge=1)
    """CPU slots of the MWRA worker registered for each run; None: one per policy."""
    stop_grace: float = Field(30.0, gt=0)
    """Seconds processes get after SIGTERM before SIGKILL."""
    health_timeout: float = Field(120.0, gt=0)
    """Seconds a service gets to report SERVING."""
    run_timeout: float = Field(1800.0, gt=0)
    """A run still going after this many seconds is stopped and reported as failed."""
    retries: int = Field(1, ge=0)
    """A failed run (a trainer exited non-zero) is started again from nothing this many times."""
    time_budget_s: float | None = Field(None, gt=0)
    """Start no further run once the runs so far plus one more (at the measured pace) would
    pass this many seconds after the first run started; the rest are reported as not run."""
    warm_start: WarmStartSettings = Field(default_factory=WarmStartSettings)
    """Warm-start policy."""
    quick: dict[str, Any] = Field(default_factory=dict)
    """Overrides deep-merged into this section by `--quick` (a reduced grid for tests)."""

    @model_validator(mode="after")
    def _check(self) -> ExperimentConfig:
        known = set(PROBES) | set(self.all_arms())
        for name, fields in self.arms.items():
            if fields.get("kind") not in PROBES:
                raise ValueError(f"arms.{name}.kind must be one of {list(PROBES)}")
            for section in (*ARM_SECTIONS, ARM_POLICIES):
                if not isinstance(fields.get(section, {}), dict):
                    raise ValueError(f"arms.{name}.{section} must be a mapping of its fields, "
                                     f"got {fields[section]!r}")
            check_arm_policies(name, fields.get(ARM_POLICIES, {}))
        unknown = [p for p in self.probes if p not in known]
        if unknown:
            raise ValueError(f"probes: unknown {unknown}; expected probe kinds {list(PROBES)} "
                             f"or arms {sorted(self.all_arms())}")
        for regime, spec in self.regimes.items():
            bad = set(spec.probe_overrides) - known
            if bad:
                raise ValueError(f"regimes.{regime}.probe_overrides: unknown {sorted(bad)}")
            bad = set(spec.probes or []) - known
            if bad:
                raise ValueError(f"regimes.{regime}.probes: unknown {sorted(bad)}")
        if len(set(self.probes)) != len(self.probes):
            raise ValueError(f"probes must be unique, got {self.probes}")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be unique, got {self.seeds}")
        if not self.regimes:
            raise ValueError("regimes: give at least one")
        missing = set(self.only_regimes or []) - set(self.regimes)
        if missing:
            raise ValueError(f"only_regimes: unknown regimes {sorted(missing)}")
        return self

    def active_regimes(self) -> dict[str, RegimeSpec]:
        """The regimes this invocation runs, in config order."""
        keep = self.only_regimes
        return {k: v for k, v in self.regimes.items() if keep is None or k in keep}

    def all_arms(self) -> dict[str, dict[str, Any]]:
        """Every named arm (built-in and configured) -> its ProbeSettings fields."""
        return {**ARMS, **self.arms}

    def arm_fields(self, arm: str) -> dict[str, Any]:
        """ProbeSettings fields of an arm (a probe kind is the arm {kind: it})."""
        return dict(self.all_arms().get(arm, {"kind": arm}))

    def regime_probes(self, regime: str) -> list[str]:
        """The arms `regime` runs: the experiment's, restricted by the regime's `probes`."""
        keep = self.regimes[regime].probes
        return [p for p in self.probes if keep is None or p in keep]

    def full(self) -> ExperimentConfig:
        """The whole grid: every regime runs every arm."""
        regimes = {k: v.model_copy(update={"probes": None}) for k, v in self.regimes.items()}
        return self.model_copy(update={"only_regimes": None, "regimes": regimes})


def check_arm_policies(arm: str, fields: dict[str, Any]) -> None:
    """Refuse an arm's `policies` fields that are not PolicySettings fields an arm may set, or
    whose values PolicySettings refuses, naming the field."""
    owned = sorted(set(fields) & set(POLICY_OWNED))
    if owned:
        raise ValueError(f"arms.{arm}.policies must not set {owned} (the regime names each "
                         "policy and its model)")
    try:
        PolicySettings.model_validate({**fields, "name": "arm", "preset": "arm"})
    except ValidationError as e:
        err = e.errors()[0]
        raise ValueError(f"arms.{arm}.policies{field_path(PolicySettings, err['loc'])}: "
                         f"{err['msg']}, got {err['input']!r}") from None


def field_path(model: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """'.a.b' for the keys of `model` (and its sub-models) that an error's `loc` names,
    without the union members and list indices pydantic adds after a field ('' for a
    model-level error)."""
    names: list[str] = []
    current: Any = model
    for part in loc:
        fields = getattr(current, "model_fields", None)
        if not isinstance(part, str) or fields is None:
            break
        names.append(part)  # a field, or the unknown key an extra-field error is about
        current = fields[part].annotation if part in fields else None
    return "".join(f".{n}" for n in names)


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over` merged in: mappings recursively, everything else replaced."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_with_extends(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """A YAML mapping; a top-level `extends: <file>` (relative to this file) names a base
    whose mapping this file's is merged into (`deep_merge`), so a study that differs from
    another in a few settings states only those."""
    here = Path(path).resolve()
    if here in _seen:
        raise ValueError(f"{path}: `extends` forms a cycle through {[str(p) for p in _seen]}")
    raw = load_yaml(here)
    base = raw.pop("extends", None)
    if base is None:
        return raw
    if not isinstance(base, str) or not base:
        raise ValueError(f"{path}: extends must be a file name, got {base!r}")
    return deep_merge(load_with_extends(here.parent / base, (*_seen, here)), raw)


def load_experiment(path: str | Path, quick: bool = False) -> tuple[ExperimentConfig,
                                                                     dict[str, Any]]:
    """The experiment section (with `quick` merged in when asked) and the whole YAML (the
    services' sections `see:`, `thl:`, `mwra:` are read from it), `extends` resolved."""
    raw = load_with_extends(path)
    section = raw.get("experiment")
    if not isinstance(section, dict):
        raise ValueError(f"{path}: needs an `experiment:` mapping")
    if quick:
        section = deep_merge({k: v for k, v in section.items() if k != "quick"},
                             section.get("quick") or {})
    return ExperimentConfig.model_validate(section), raw


def config_hash(obj: Any) -> str:
    """Short stable hash of a JSON-able object (warm-start cache keys)."""
    text = json.dumps(obj, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:10]
