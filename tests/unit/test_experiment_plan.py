"""The experiment grid: config validation, quick overrides, pairing across probes, warm-start
reuse and the run ids (pure, no processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from mutualrl.experiment.config import PROBES, ExperimentConfig, deep_merge, load_experiment
from mutualrl.experiment.plan import build_plan, fmt_duration

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "probe-comparison.yaml"


def _cfg(**over: Any) -> ExperimentConfig:
    base: dict[str, Any] = {
        "seeds": [0, 1],
        "regimes": {"short": {
            "task": {"regime": "short"},
            "policies": [{"name": "A", "preset": "gpt2-bpe", "strong_skills": ["add", "rev"]},
                         {"name": "B", "preset": "llama-char", "strong_skills": ["sub", "sort"]}],
            "trainer": {"grpo": {"rounds": 10}, "probe": {"tau": 1.0}},
            "probe_overrides": {"prp": {"prp_weight_mode": "truncate"}},
        }},
    }
    return ExperimentConfig.model_validate(deep_merge(base, over))


def test_default_config_is_the_papers_comparison_within_75_minutes() -> None:
    """The default is GRPO against PRP, XGRPO and SGT plus SGT's control sgt-self and the
    published HACPO and SAPO, in both two-policy regimes over 3 paired seeds, in the
    deterministic exchange mode; its estimate (the paces measured on the 2-core machine) fits
    its own time budget, which leaves the warm starts and services (10 min) room within 75
    minutes. HACPO's ablation and F-TIS are opt-in arms; `hacpo` is its paper's
    configuration."""
    cfg, raw = load_experiment(CONFIG)
    plan = build_plan(cfg, Path("/tmp/x"))
    assert cfg.probes == ["none", "xgrpo", "sgt", "sgt-self", "oracle", "prp-seq", "prp-chunk",
                          "hacpo", "hacpo-naive", "sapo", "ftis"]
    assert len(cfg.seeds) >= 3
    assert list(cfg.active_regimes()) == ["short", "worked"]
    for regime in cfg.active_regimes():
        assert cfg.regime_probes(regime) == ["none", "xgrpo", "sgt", "sgt-self", "prp-seq",
                                             "hacpo", "sapo"]
    assert len(plan.runs) == 2 * 7 * len(cfg.seeds)
    # HACPO as its paper runs it reads the peers' same round; every other arm the round before.
    assert all(r.trainer["exchange"] == {"mode": "deterministic",
                                         "staleness": 0 if r.probe == "hacpo" else 1}
               for r in plan.runs)
    # One warm start per (policy, SFT config), reused by every seed, arm and regime.
    assert len(plan.warm_starts) == 4
    assert cfg.time_budget_s is not None and plan.eta_s < cfg.time_budget_s, plan.eta_s
    assert cfg.time_budget_s + 10 * 60 <= 75 * 60
    full = build_plan(cfg.full(), Path("/tmp/x"))
    assert len(full.runs) == 4 * 11 * len(cfg.seeds) and len(full.warm_starts) == 6
    assert {"see", "thl", "mwra"} <= set(raw)


def test_quick_overrides_shrink_the_grid() -> None:
    cfg, _ = load_experiment(CONFIG, quick=True)
    full, _ = load_experiment(CONFIG)
    plan = build_plan(cfg, Path("/tmp/x"))
    assert cfg.seeds == [0] and cfg.probes == full.probes
    assert len(plan.runs) == 10 and len(plan.warm_starts) == 3
    # Every probe kind is in the quick grid.
    assert {cfg.arm_fields(r.probe)["kind"] for r in plan.runs} == set(PROBES)
    assert all(r.rounds <= 5 for r in plan.runs)
    assert all(w.sft["steps"] <= 100 for w in plan.warm_starts)
    # Unchanged knobs survive the deep merge.
    assert cfg.regimes["short"].trainer["grpo"]["lr"] == full.regimes["short"].trainer["grpo"]["lr"]
    assert cfg.run_prefix != full.run_prefix


def test_runs_of_a_seed_differ_only_in_probe_and_run_id() -> None:
    plan = build_plan(_cfg(), Path("/tmp/x"))
    by_seed: dict[int, list[Any]] = {}
    for r in plan.runs:
        by_seed.setdefault(r.seed, []).append(r)
    for seed, runs in by_seed.items():
        assert [r.probe for r in runs] == ["none", "prp", "xgrpo", "sgt"]
        norm = []
        for r in runs:
            t = {k: v for k, v in r.trainer.items() if k not in ("run_id", "probe")}
            norm.append(t)
            assert r.trainer["seed"] == seed and r.trainer["probe"]["kind"] == r.probe
        assert all(n == norm[0] for n in norm)
        prp = next(r for r in runs if r.probe == "prp")
        assert prp.trainer["probe"]["prp_weight_mode"] == "truncate"
        sgt = next(r for r in runs if r.probe == "sgt")
        assert "prp_weight_mode" not in sgt.trainer["probe"]
    ids = [r.run_id for r in plan.runs]
    assert len(set(ids)) == len(ids)
    assert ids[0] == "pc-short-none-s0"


def test_warm_starts_shared_or_per_seed() -> None:
    shared = build_plan(_cfg(), Path("/tmp/x"))
    assert len(shared.warm_starts) == 2
    ckpts = {tuple(p["sft_checkpoint"] for p in r.trainer["policies"]) for r in shared.runs}
    assert len(ckpts) == 1
    per_seed = build_plan(_cfg(warm_start={"per_seed": True}), Path("/tmp/x"))
    assert len(per_seed.warm_starts) == 4
    assert {w.seed for w in per_seed.warm_starts} == {0, 1}
    # The warm-start directory is keyed by the SFT config: a change gives a new directory.
    changed = build_plan(_cfg(regimes={"short": {"sft": {"steps": 7}}}), Path("/tmp/x"))
    assert {w.out_dir for w in changed.warm_starts}.isdisjoint(
        {w.out_dir for w in shared.warm_starts})
    w = shared.warm_starts[0]
    assert w.sft["strong_skills"] == ["add", "rev"] and w.sft["task"]["regime"] == "short"


def test_bad_configs_are_refused_with_the_field() -> None:
    with pytest.raises(ValidationError, match=r"probes: unknown \['ppo'\]"):
        _cfg(probes=["sgt", "ppo"])
    with pytest.raises(ValidationError, match=r"probe_overrides: unknown \['ppo'\]"):
        _cfg(regimes={"short": {"probe_overrides": {"ppo": {}}}})
    with pytest.raises(ValidationError, match=r"regimes.short.probes: unknown"):
        _cfg(regimes={"short": {"probes": ["none", "magic"]}})
    with pytest.raises(ValidationError, match=r"arms.x.kind"):
        _cfg(arms={"x": {"kind": "ppo"}})
    with pytest.raises(ValidationError, match="only_regimes"):
        _cfg(only_regimes=["long"])
    with pytest.raises(ValueError, match="must not set"):
        build_plan(_cfg(regimes={"short": {"trainer": {"seed": 3}}}), Path("/tmp/x"))


def test_fmt_duration() -> None:
    assert fmt_duration(42) == "42s"
    assert fmt_duration(725) == "12m05s"
    assert fmt_duration(3720) == "1h02m"


def test_gpu_config_plans_runs_from_checkpoints_without_warm_starts() -> None:
    cfg, _ = load_experiment(CONFIG.with_name("probe-comparison-gpu.yaml"))
    plan = build_plan(cfg, Path("/tmp/x"))
    assert plan.warm_starts == []
    assert len(plan.runs) == len(cfg.regimes) * 4 * len(cfg.seeds)
    pols = plan.runs[0].trainer["policies"]
    assert all("sft_checkpoint" not in p and p["rollout_engine"] == "sglang" for p in pols)
    assert {p["device"] for p in pols} == {"cuda:0", "cuda:1"}


def test_gpu_config_runs_validate_as_trainer_configs_with_a_jsonl_task() -> None:
    from mutualrl.trainer.config.run import TrainerConfig
    from mutualrl.trainer.config.task import JsonlTaskConfig

    cfg, _ = load_experiment(CONFIG.with_name("probe-comparison-gpu.yaml"))
    for run in build_plan(cfg, Path("/tmp/x")).runs:
        trainer = TrainerConfig.model_validate(run.trainer)
        assert isinstance(trainer.task, JsonlTaskConfig)
        assert trainer.task.form == "math"


def test_arms_regime_subsets_and_full_grid() -> None:
    cfg = _cfg(probes=["none", "sgt", "sgt-self", "oracle", "prp-seq", "prp-chunk", "prp-none"],
               arms={"prp-none": {"kind": "prp", "prp_weight_mode": "none"}},
               regimes={"short": {"probes": ["none", "sgt", "prp-chunk", "prp-none"],
                                  "probe_overrides": {"prp-chunk": {"prp_cap": 2.0}}}})
    plan = build_plan(cfg, Path("/tmp/x"))
    by_arm = {r.probe: r.trainer["probe"] for r in plan.runs if r.seed == 0}
    assert list(by_arm) == ["none", "sgt", "prp-chunk", "prp-none"]
    # The kind's override (truncate), then the arm's fields, then the arm's own override.
    assert by_arm["prp-chunk"] == {"tau": 1.0, "prp_weight_mode": "truncate",
                                   "prp_level": "chunk", "prp_cap": 2.0, "kind": "prp"}
    assert by_arm["prp-none"]["prp_weight_mode"] == "none" and by_arm["sgt"]["kind"] == "sgt"
    assert plan.runs[2].run_id == "pc-short-prp-chunk-s0"
    full = build_plan(cfg.full(), Path("/tmp/x"))
    assert [r.probe for r in full.runs if r.seed == 0] == cfg.probes
    from mutualrl.trainer.config.run import TrainerConfig

    for r in full.runs:
        TrainerConfig.model_validate(r.trainer)


def test_default_config_subset_and_full_grid() -> None:
    cfg, _ = load_experiment(CONFIG)
    plan = build_plan(cfg, Path("/tmp/x"))
    full = build_plan(cfg.full(), Path("/tmp/x"))
    assert len(full.runs) > len(plan.runs)
    three = [r for r in full.runs if len(r.policies) == 3]
    assert three and {r.probe for r in three} >= {"none", "sgt"}
    assert {r.rounds for r in three if r.regime == "worked3"} == {160}
    arms = {(r.regime, r.probe) for r in plan.runs}
    full_arms = {(r.regime, r.probe) for r in full.runs}
    for regime in ("short", "worked"):
        assert {(regime, a) for a in ("none", "prp-seq", "xgrpo", "sgt", "sgt-self")} <= arms
        assert {(regime, a) for a in ("none", "sgt", "sgt-self", "oracle")} <= full_arms


def test_extends_merges_a_study_into_its_base(tmp_path: Path) -> None:
    base = tmp_path / "base.yaml"
    base.write_text("experiment:\n  name: base\n  seeds: [0, 1]\n  regimes:\n    short:\n"
                    "      task: {regime: short}\n      policies:\n"
                    "        - {name: A, preset: gpt2-bpe, strong_skills: [add]}\n"
                    "        - {name: B, preset: llama-char, strong_skills: [sub]}\n"
                    "      trainer: {grpo: {rounds: 10, lr: 0.001}}\nsee: {retention: {}}\n")
    study = tmp_path / "sub" / "study.yaml"
    study.parent.mkdir()
    study.write_text("extends: ../base.yaml\nexperiment:\n  name: study\n  regimes:\n"
                     "    short: {trainer: {grpo: {rounds: 3}}}\n")
    cfg, raw = load_experiment(study)
    assert cfg.name == "study" and cfg.seeds == [0, 1]
    assert cfg.regimes["short"].trainer["grpo"] == {"rounds": 3, "lr": 0.001}
    assert [p.name for p in cfg.regimes["short"].policies] == ["A", "B"]
    assert "see" in raw and "extends" not in raw
    base.write_text("extends: sub/study.yaml\n")
    with pytest.raises(ValueError, match="cycle"):
        load_experiment(study)
    study.write_text("extends: [a, b]\n")
    with pytest.raises(ValueError, match="extends must be a file name"):
        load_experiment(study)


def test_prp_levels_config_runs_both_levels_in_both_regimes() -> None:
    """Sequence- and chunk-level PRP against GRPO in both regimes, on the
    probe comparison's policies and warm starts (the same SFT configs, so the same cache keys),
    within its own time budget."""
    cfg, raw = load_experiment(CONFIG.with_name("prp-levels.yaml"))
    base, _ = load_experiment(CONFIG)
    plan = build_plan(cfg, Path("/tmp/x"))
    assert {(r.regime, r.probe) for r in plan.runs} == {
        (g, p) for g in ("short", "worked") for p in ("none", "prp-seq", "prp-chunk")}
    assert len(plan.runs) == 6 * len(cfg.seeds) and len(cfg.seeds) >= 3
    levels = {(r.regime, r.probe): r.trainer["probe"]["prp_level"] for r in plan.runs
              if r.probe != "none"}
    assert set(levels.values()) == {"sequence", "chunk"}
    assert all(levels[(g, "prp-chunk")] == "chunk" for g in ("short", "worked"))
    base_warm = {w.key: w.sft for w in build_plan(base, Path("/tmp/x")).warm_starts}
    for w in plan.warm_starts:
        assert base_warm[w.key] == w.sft
    for r in plan.runs:
        assert r.trainer["diagnostics"]["support_every"] == 5
        # the settings its figures were measured with: worked at 160 rounds, asynchronous
        rounds = {"rounds": 160} if r.regime == "worked" else {}
        assert r.trainer["grpo"] == {**base.regimes[r.regime].trainer["grpo"], **rounds}
        assert r.trainer["exchange"]["mode"] == "asynchronous"
    assert cfg.time_budget_s is not None and plan.eta_s < cfg.time_budget_s
    assert {"see", "thl", "mwra"} <= set(raw)


def test_a_regime_on_its_own_reuses_a_finished_warm_start_of_the_same_sft_config(
        tmp_path: Path) -> None:
    """`same` warm-starts gpt2-bpe exactly as `short` does: run alone after `short`, it takes
    short's finished checkpoint instead of training a copy; an unfinished one is not taken."""
    cfg, _ = load_experiment(CONFIG.parent / "published-methods.yaml")
    cfg = cfg.model_copy(update={"warm_start": cfg.warm_start.model_copy(
        update={"cache_dir": tmp_path})})
    short = {w.policy: w for w in build_plan(cfg.model_copy(update={"only_regimes": ["short"]}),
                                             tmp_path).warm_starts}
    alone = cfg.model_copy(update={"only_regimes": ["same"]})
    fresh = {w.policy: w.out_dir for w in build_plan(alone, tmp_path).warm_starts}
    assert fresh["gpt2-bpe"] != short["gpt2-bpe"].out_dir  # nothing finished yet
    short["gpt2-bpe"].out_dir.mkdir(parents=True)
    (short["gpt2-bpe"].out_dir / "sft_eval.json").write_text("{}")
    reused = {w.policy: w.out_dir for w in build_plan(alone, tmp_path).warm_starts}
    assert reused["gpt2-bpe"] == short["gpt2-bpe"].out_dir
    assert reused["gpt2-bpe-b"] == fresh["gpt2-bpe-b"]


def test_an_arm_sets_every_policys_fields_over_the_regimes() -> None:
    """An arm's `policies` fields reach every policy of its runs, over the regime's own
    policy fields, and only its runs: the other arms of the seed keep the regime's."""
    cfg = _cfg(probes=["none", "sgt-d1"],
               arms={"sgt-d1": {"kind": "sgt", "grpo": {"max_off_policy_steps": 1},
                                "policies": {"rollout_worker": True, "threads": 2}}},
               regimes={"short": {"policies": [
                   {"name": "A", "preset": "gpt2-bpe", "strong_skills": ["add"],
                    "trainer": {"threads": 3, "dtype": "float32"}},
                   {"name": "B", "preset": "llama-char", "strong_skills": ["sub"]}]}})
    from mutualrl.trainer.config.run import TrainerConfig

    runs = {r.probe: r.trainer for r in build_plan(cfg, Path("/tmp/x")).runs if r.seed == 0}
    d1 = TrainerConfig.model_validate(runs["sgt-d1"])
    assert [(p.name, p.rollout_worker, p.threads) for p in d1.policies] == [
        ("A", True, 2), ("B", True, 2)]
    assert d1.policies[0].dtype == "float32" and d1.probe.kind == "sgt"
    assert d1.grpo.max_off_policy_steps == 1 and "policies" not in runs["sgt-d1"]["probe"]
    none = TrainerConfig.model_validate(runs["none"])
    assert [(p.rollout_worker, p.threads) for p in none.policies] == [(False, 3), (False, 1)]
    assert none.grpo.max_off_policy_steps == 0


def test_an_arms_policy_fields_are_refused_naming_the_field() -> None:
    def arm(policies: Any) -> ExperimentConfig:
        return _cfg(probes=["none", "x"], arms={"x": {"kind": "none", "policies": policies}})

    with pytest.raises(ValidationError, match=r"arms\.x\.policies\.rollout_worker: Input"):
        arm({"rollout_worker": "sometimes"})
    with pytest.raises(ValidationError, match=r"arms\.x\.policies\.rollout_workers: Extra"):
        arm({"rollout_workers": True})
    with pytest.raises(ValidationError, match=r"arms\.x\.policies must not set \['preset'\]"):
        arm({"preset": "gpt2-bpe"})
    with pytest.raises(ValidationError, match=r"arms\.x\.policies: .*rollout_worker with nproc"):
        arm({"rollout_worker": True, "nproc": 2})
    with pytest.raises(ValidationError, match=r"arms\.x\.policies must be a mapping"):
        arm([{"rollout_worker": True}])
    with pytest.raises(ValidationError, match=r"arms\.x\.grpo must be a mapping"):
        _cfg(probes=["x"], arms={"x": {"kind": "none", "grpo": 1}})


def test_off_policy_config_pairs_sgt_and_none_at_both_lags() -> None:
    """none and sgt on-policy in-process (d = 0) and with a rollout worker one version behind
    (d = 1), on the probe comparison's `short` regime, warm starts and paired seeds, in the
    deterministic exchange mode; the four arms of a seed differ only in probe, lag and
    worker; both lags report SGT − none."""
    cfg, _ = load_experiment(CONFIG.with_name("off-policy-comparison.yaml"))
    base, _ = load_experiment(CONFIG)
    plan = build_plan(cfg, Path("/tmp/x"))
    assert len(cfg.seeds) >= 3 and len(plan.runs) == 4 * len(cfg.seeds)
    assert {("sgt", "none"), ("sgt-d1", "none-d1")} <= set(cfg.contrasts)
    base_warm = {w.key: w.sft for w in build_plan(base, Path("/tmp/x")).warm_starts}
    assert {w.key: w.sft for w in plan.warm_starts} == {
        k: v for k, v in base_warm.items() if k.startswith("short/")}
    from mutualrl.trainer.config.run import TrainerConfig

    for r in plan.runs:
        t = TrainerConfig.model_validate(r.trainer)
        lag = 1 if r.probe.endswith("-d1") else 0
        assert t.probe.kind == r.probe.removesuffix("-d1") and r.regime == "short"
        assert t.grpo.max_off_policy_steps == lag and t.grpo.off_policy_correction == "tis"
        assert all(p.rollout_worker is bool(lag) for p in t.policies)
        assert t.exchange.mode == "deterministic"
        assert r.trainer["grpo"] == {**base.regimes["short"].trainer["grpo"],
                                     **({"max_off_policy_steps": 1} if lag else {})}
    assert cfg.time_budget_s is not None and plan.eta_s < cfg.time_budget_s
    half, _ = load_experiment(CONFIG.with_name("off-policy-comparison-150.yaml"))
    short = build_plan(half, Path("/tmp/x"))
    assert [(r.probe, r.seed) for r in short.runs] == [(r.probe, r.seed) for r in plan.runs]
    for a, b in zip(short.runs, plan.runs, strict=True):
        assert a.rounds == 150 and a.trainer["grpo"] == {**b.trainer["grpo"], "rounds": 150}
        assert {k: v for k, v in a.trainer.items() if k not in ("grpo", "run_id")} == {
            k: v for k, v in b.trainer.items() if k not in ("grpo", "run_id")}
    assert half.time_budget_s is not None and short.eta_s < half.time_budget_s
