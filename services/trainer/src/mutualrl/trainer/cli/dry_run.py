"""`mutualrl train --dry-run`: every policy's memory plan (mutualrl.trainer.runtime.memory)
against the device's size, from the model's config (no weights are loaded) and the run's
problems as the policy renders them (`mutualrl.trainer.runtime.preflight`: its longest prompt
sets a rollout's length; where the task's files or the tokenizer are not at hand,
`--prompt-tokens` or a 512-token allowance stands in, and the plan says so). A CPU policy's
plan counts the trainer process's own share of host memory as measured here, after importing
what a trainer imports."""

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


PROMPT_ALLOWANCE = 512
"""Prompt tokens planned for when the problems cannot be rendered here."""


def probe_rows(cfg: TrainerConfig) -> int:
    """The most rows a round's probe adds to its own samples: PRP's peer rollouts (each peer's
    at most `prp_max_peer_per_prompt` per prompt), SGT's demonstrations."""
    p, peers = cfg.probe, len(cfg.policies) - 1
    prompts = cfg.grpo.prompts_per_round
    if p.kind == "prp":
        return prompts * peers * min(p.prp_max_peer_per_prompt, cfg.grpo.group_size)
    if p.kind in ("sgt", "sgt-self", "oracle"):
        return prompts * p.sgt_max_per_prompt
    return 0


def plan_inputs(cfg: TrainerConfig, policy: PolicySettings, prompt_tokens: int,
                runtime_bytes: int = 0) -> PlanInputs:
    """What the plan reads from `cfg` (the policy's own grpo overrides applied already)."""
    g = cfg.grpo
    b = DTYPE_BYTES[policy.dtype]
    on_cuda = policy.device.startswith("cuda")
    max_new = g.max_new_tokens or getattr(cfg.task, "max_new_tokens", None) or 256
    rows = g.prompts_per_round * g.group_size
    # One step's mini-batch, split over the ranks (each scores its block of the rows).
    step_rows = -(-(rows + probe_rows(cfg)) // (g.mini_batches * max(policy.nproc, 1)))
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
        rows=rows, seq_tokens=prompt_tokens + max_new,
        engine=policy.rollout_engine, mem_fraction_static=share, release_memory=release,
        nproc=policy.nproc, engine_bytes=served, engine_pool_bytes=pool,
        train_rows=step_rows, max_new_tokens=max_new,
        runtime_bytes=0 if on_cuda else runtime_bytes)


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


def runtime_bytes(engines: set[str]) -> int:
    """This process's resident memory once it has imported what a trainer of these engines
    imports (torch, transformers, the SDK, the task's libraries: the caller has built the
    task): a trainer's share of host memory before any model, as measured, not guessed."""
    import importlib

    for module in ("mutualrl.trainer.runtime.loop", "mutualrl.trainer.runtime.session",
                   "mutualrl.client.see", "mutualrl.client.thl", "mutualrl.client.mwra",
                   "mutualrl.trainer.engines.hf",
                   *(["mutualrl.trainer.engines.vllm"] if "vllm" in engines else [])):
        importlib.import_module(module)
    resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def prompt_lengths(cfg: TrainerConfig, names: list[str], cache_dir: Path | None
                   ) -> tuple[dict[str, int], str]:
    """Each policy's longest rendered prompt (`preflight.check_inputs`), or the allowance
    for all with the reason when the problems cannot be rendered here. A prompt that does
    not fit the model's context raises (ContextLengthError): that run cannot start."""
    from mutualrl.trainer.data.chat import ContextLengthError
    from mutualrl.trainer.runtime.preflight import check_inputs

    try:
        budgets = check_inputs(cfg, names, cache_dir)
    except ContextLengthError:
        raise
    except (ValueError, OSError, TypeError) as err:
        reason = str(err).splitlines()[0][:300]
        return {n: PROMPT_ALLOWANCE for n in names}, (
            f"prompt allowance {PROMPT_ALLOWANCE} tokens (the problems could not be rendered "
            f"here: {reason})")
    return {b.policy: b.prompt_tokens for b in budgets}, ""


def memory_plans(cfg: TrainerConfig, names: list[str] | None = None,
                 device_memory_gb: float | None = None, prompt_tokens: int | None = None,
                 cache_dir: Path | None = None) -> list[PolicyPlan]:
    """The plan of each policy in `names` (default: every policy of the run). `prompt_tokens`
    None: each policy's longest rendered prompt (see the module docstring)."""
    from mutualrl.trainer.runtime.preflight import policy_dir

    names = names or [p.name for p in cfg.policies]
    note = ""
    if prompt_tokens is None:
        longest, note = prompt_lengths(cfg, names, cache_dir)
    else:
        longest = {n: prompt_tokens for n in names}
    on_cpu: set[str] = {cfg.policy(n).rollout_engine for n in names
              if not cfg.policy(n).device.startswith("cuda")}
    runtime = runtime_bytes(on_cpu) if on_cpu else 0
    out = []
    for name in names:
        pcfg = cfg.for_policy(name)
        policy = pcfg.policy(name)
        path = policy_dir(policy, cache_dir or pcfg.output_dir / "presets", pcfg.seed)
        if not (Path(path) / "config.json").exists():
            raise FileNotFoundError(f"policy {name}: {path} has no config.json")
        shape = model_shape(path, policy.lora)
        x = plan_inputs(pcfg, policy, longest[name], runtime)
        p = plan(shape, x, device_bytes(policy, device_memory_gb))
        text = render(name, p, x, shape)
        source = note or ("--prompt-tokens" if prompt_tokens is not None
                          else "its longest rendered prompt")
        text += f"\n  rollouts of {x.seq_tokens:,} tokens: {source}"
        out.append(PolicyPlan(name, shape, x, p, text))
    return out
