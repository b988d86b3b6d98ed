"""The demo (`make run`) is the probe comparison's `short`/`sgt` cell of seed 0: the claims
README makes about the demo are measured over 3 seeds there, so the two configs must agree."""

from __future__ import annotations

from pathlib import Path

from mutualrl.common.config import load_yaml
from mutualrl.experiment.config import load_experiment
from mutualrl.experiment.plan import build_plan
from mutualrl.trainer.config.run import load_trainer_config
from mutualrl.trainer.config.sft import SFTConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_demo_is_the_short_sgt_cell_of_the_probe_comparison() -> None:
    demo = load_trainer_config(CONFIGS / "demo.yaml", {})
    cfg, _ = load_experiment(CONFIGS / "probe-comparison.yaml")
    cell = next(r for r in build_plan(cfg, Path("/tmp/x")).runs
                if (r.regime, r.probe, r.seed) == ("short", "sgt", demo.seed))
    from mutualrl.trainer.config.run import TrainerConfig

    exp = TrainerConfig.model_validate({**cell.trainer, "services": {"local": True}})
    assert demo.grpo == exp.grpo and demo.probe == exp.probe and demo.task == exp.task
    assert demo.exchange == exp.exchange and demo.exchange.mode == "deterministic"
    assert demo.diagnostics == exp.diagnostics
    assert demo.eval == exp.eval
    assert [(p.name, p.preset) for p in demo.policies] == [(p.name, p.preset)
                                                          for p in exp.policies]
    warm = load_yaml(CONFIGS / "demo.yaml")["up"]["warm_start"]
    ignore = {"out_dir", "cache_dir", "progress"}
    for name, w in cell.warm.items():
        ours = SFTConfig.model_validate(warm[name]).model_dump(exclude=ignore)
        theirs = SFTConfig.model_validate(w.sft).model_dump(exclude=ignore)
        assert ours == theirs, name
