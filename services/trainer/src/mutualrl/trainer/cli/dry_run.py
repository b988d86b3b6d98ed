"""`mutualrl train --dry-run`: every policy's memory plan (mutualrl.trainer.runtime.memory) from the
config alone, against the device's size; nothing is loaded but model configs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from mutualrl.trainer.config.run import PolicySettings, TrainerConfig
from mutualrl.trainer.runtime.memory import (
    DTYPE_BYTES,
    GIB,
    MemoryPlan,
    ModelShape,
    PlanInputs,
    model_shape,
    plan,
    render,
)


@dataclass
class PolicyPlan:
    policy: str
    shape: ModelShape
    inputs: PlanInputs
    plan: MemoryPlan
    text: str


def plan_inputs(cfg: TrainerConfig, policy: PolicySettings, prompt_tokens: int) -> PlanInputs:
    """What the plan reads from `cfg` (the policy's own grpo overrides applied already)."""
    g = cfg.grpo
    b = DTYPE_BYTES[policy.dtype]
    on_cuda = policy.device.startswith("cuda")
    max_new = g.max_new_tokens or getattr(cfg.task, "max_new_tokens", None) or 256
    compute = DTYPE_BYTES[policy.compute]
    if g.autocast_bf16 and on_cuda:
        compute = 2
    share, release, pool = policy.sglang.mem_fraction_static, policy.sglang.release_memory, None
    served = DTYPE_BYTES[policy.compute]  # engines serve in the compute dtype
    if policy.rollout_engine == "vllm":
        v = policy.vllm
        share, release = v.gpu_memory_utilization, v.release_memory and on_cuda
        served = DTYPE_BYTES[v.dtype or policy.compute]
        if not on_cuda:  # an explicit KV size (GiB) beside the engine's copy of the weights
            pool = int(v.kv_cache_gib * GIB)
    return PlanInputs(
        dtype_bytes=b, act_bytes=compute,
        micro_batch_tokens=g.micro_batch_tokens, logit_chunk_tokens=g.logit_chunk_tokens,
        activation_checkpointing=g.activation_checkpointing,
        reference_copy=policy.lora is None and (g.beta > 0 or cfg.diagnostics.kl_every > 0),
        rows=g.prompts_per_round * g.group_size, seq_tokens=prompt_tokens + max_new,
        engine=policy.rollout_engine, mem_fraction_static=share, release_memory=release,
        nproc=policy.nproc, engine_bytes=served, engine_pool_bytes=pool)


def device_bytes(policy: PolicySettings, device_memory_gb: float | None) -> int:
    """The size to plan against: the flag, else the CUDA device's memory, else host RAM for a
    CPU policy; a CUDA policy planned on a machine without that device needs the flag."""
    if device_memory_gb is not None:
        return int(device_memory_gb * GIB)
    if policy.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"policy {policy.name} runs on {policy.device} and no CUDA device "
                             "is visible here: give --device-memory-gb")
        index = torch.device(policy.device).index or 0
        return int(torch.cuda.get_device_properties(index).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


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
        x = plan_inputs(pcfg, policy, prompt_tokens)
        p = plan(shape, x, device_bytes(policy, device_memory_gb))
        out.append(PolicyPlan(name, shape, x, p, render(name, p, x, shape)))
    return out
