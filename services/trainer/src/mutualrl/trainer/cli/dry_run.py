"""`mutualrl train --dry-run`: every policy's memory plan (mutualrl.trainer.runtime.memory) from the
config alone, against the device's size; nothing is loaded but model configs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mutualrl.trainer.config.run import TrainerConfig
from mutualrl.trainer.runtime.memory import (
    MemoryPlan,
    ModelShape,
    PlanInputs,
    device_bytes,
    model_shape,
    policy_plan,
    render,
)


@dataclass
class PolicyPlan:
    policy: str
    shape: ModelShape
    inputs: PlanInputs
    plan: MemoryPlan
    text: str


def memory_plans(cfg: TrainerConfig, names: list[str] | None = None,
                 device_memory_gb: float | None = None, prompt_tokens: int = 512,
                 cache_dir: Path | None = None) -> list[PolicyPlan]:
    """The plan of each policy in `names` (default: every policy of the run)."""
    from mutualrl.trainer.runtime.session import policy_dir

    out = []
    for name in names or [p.name for p in cfg.policies]:
        pcfg = cfg.for_policy(name)
        policy = pcfg.policy(name)
        path = policy_dir(policy, cache_dir or pcfg.output_dir / "presets", pcfg.seed)
        if not (Path(path) / "config.json").exists():
            raise FileNotFoundError(f"policy {name}: {path} has no config.json")
        shape = model_shape(path, policy.lora)
        x, p = policy_plan(shape, pcfg, policy, prompt_tokens,
                           device_bytes(policy, device_memory_gb))
        out.append(PolicyPlan(name, shape, x, p, render(name, p, x, shape)))
    return out
