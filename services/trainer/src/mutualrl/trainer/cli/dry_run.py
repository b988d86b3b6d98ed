"""`mutualrl train --dry-run`: every policy's memory plan (mutualrl.trainer.runtime.memory)
against the device's size, from the model's config (no weights are loaded) and the run's
problems as the policy renders them (`mutualrl.trainer.runtime.preflight`: its longest prompt
sets a rollout's length; where the task's files or the tokenizer are not at hand,
`--prompt-tokens` or a 512-token allowance stands in, and the plan says so). A CPU policy's
plan counts the trainer process's own share of host memory as measured here, after importing
what a trainer imports. Under each plan: the benchmarks the policy will be scored on, each
with its table, columns, problems scored and dropped, and sampling settings."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path

from mutualrl.trainer.config.run import PolicySettings, TrainerConfig
from mutualrl.trainer.data.chat import ContextLengthError
from mutualrl.trainer.runtime.memory import (
    GIB,
    MemoryPlan,
    ModelShape,
    PlanInputs,
    device_bytes,
    model_shape,
    policy_plan,
    render,
    worker_plan,
)
from mutualrl.trainer.runtime.preflight import PromptBudget, check_inputs, policy_dir


@dataclass
class PolicyPlan:
    policy: str
    shape: ModelShape
    inputs: PlanInputs
    plan: MemoryPlan
    text: str


PROMPT_ALLOWANCE = 512
"""Prompt tokens planned for when the problems cannot be rendered here."""


def runtime_bytes(engines: set[str]) -> int:
    """This process's resident memory once it has imported what a trainer of these engines
    imports (torch, transformers, the SDK, the task's libraries: the caller has built the
    task): a trainer's share of host memory before any model, as measured, not guessed."""
    for module in ("mutualrl.trainer.runtime.loop", "mutualrl.trainer.runtime.session",
                   "mutualrl.client.see", "mutualrl.client.thl", "mutualrl.client.mwra",
                   "mutualrl.trainer.engines.hf",
                   *(["mutualrl.trainer.engines.vllm"] if "vllm" in engines else [])):
        importlib.import_module(module)
    resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def prompt_budgets(cfg: TrainerConfig, names: list[str], cache_dir: Path | None
                   ) -> tuple[dict[str, PromptBudget], str]:
    """Each policy's longest rendered prompt and benchmark settings
    (`preflight.check_inputs`), or none with the reason when the problems cannot be rendered
    here (the allowance stands in). A prompt that does not fit the model's context raises
    (ContextLengthError): that run cannot start."""
    try:
        budgets = check_inputs(cfg, names, cache_dir)
    except ContextLengthError:
        raise
    except (ValueError, OSError, TypeError) as err:
        reason = str(err).splitlines()[0][:300]
        return {}, (f"prompt allowance {PROMPT_ALLOWANCE} tokens (the problems could not be "
                    f"rendered here: {reason})")
    return {b.policy: b for b in budgets}, ""


def worker_lines(items: dict[str, int], p: MemoryPlan) -> str:
    """The rollout worker's part of the plan, and the learner's training peak beside it."""
    total = sum(items.values())
    parts = ", ".join(f"{k} {v / GIB:.2f}" for k, v in items.items())
    both = p.train_peak + total
    verdict = "fits" if both <= p.room else "does NOT fit: set rollout_worker: false"
    return (f"  rollout worker: {total / GIB:.2f} GiB ({parts} GiB); beside the learner's "
            f"training peak {both / GIB:.2f} GiB of {p.room / GIB:.2f} GiB usable: {verdict}")


def other_sharding(shape: ModelShape, cfg: TrainerConfig, policy: PolicySettings,
                   prompt_tokens: int, size: int, runtime: int) -> str:
    """One line: the peaks of a policy across nodes under the sharding it does not use (HSDP
    for FSDP2, FSDP2 for HSDP), and whether that fits: HSDP gathers within a node and sends
    only gradients between nodes, so it is the faster one wherever a node's devices hold the
    shards."""
    other = "fsdp" if policy.sharding == "hsdp" else "hsdp"
    x, p = policy_plan(shape, cfg, policy.model_copy(update={"sharding": other}),
                       prompt_tokens, size, runtime)
    verdict = "fits" if p.fits else "does not fit"
    return (f"  with sharding: {other} ({x.sharding()}): rollouts {p.rollout_peak / GIB:.2f}, "
            f"training {p.train_peak / GIB:.2f} GiB per rank: {verdict}")


def memory_plans(cfg: TrainerConfig, names: list[str] | None = None,
                 device_memory_gb: float | None = None, prompt_tokens: int | None = None,
                 cache_dir: Path | None = None) -> list[PolicyPlan]:
    """The plan of each policy in `names` (default: every policy of the run). `prompt_tokens`
    None: each policy's longest rendered prompt (see the module docstring)."""
    names = names or [p.name for p in cfg.policies]
    note = ""
    budgets: dict[str, PromptBudget] = {}
    if prompt_tokens is None:
        budgets, note = prompt_budgets(cfg, names, cache_dir)
    longest = {n: budgets[n].prompt_tokens if n in budgets else prompt_tokens or PROMPT_ALLOWANCE
               for n in names}
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
        x, p = policy_plan(shape, pcfg, policy, longest[name],
                           device_bytes(policy, device_memory_gb), runtime)
        text = render(name, p, x, shape)
        if policy.nnodes > 1:
            text += "\n" + other_sharding(shape, pcfg, policy, longest[name],
                                          device_bytes(policy, device_memory_gb), runtime)
        source = note or ("--prompt-tokens" if prompt_tokens is not None
                          else "its longest rendered prompt")
        text += f"\n  rollouts of {x.seq_tokens:,} tokens: {source}"
        if policy.rollout_worker is not False:
            worker = worker_plan(shape, x, p, max(1, pcfg.grpo.max_off_policy_steps))
            text += "\n" + worker_lines(worker, p)
            if p.train_peak + sum(worker.values()) > p.room:
                p.problems.append(f"policies[].rollout_worker: the worker's "
                                  f"{sum(worker.values()) / GIB:.2f} GiB does not fit beside "
                                  "training: set rollout_worker: false")
        if name in budgets:
            text += "".join(f"\n  {line}" for line in budgets[name].benchmarks)
        out.append(PolicyPlan(name, shape, x, p, text))
    return out
