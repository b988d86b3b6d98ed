"""Everything one policy's trainer holds, built from its config: model, reference, optimizer,
schedule, rollout engine, task, probe, peer exchange, allocator, metrics, checkpoints.

`loop.py` walks a round over these; keeping construction here keeps the loop readable.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler
from transformers import PreTrainedModel, PreTrainedTokenizerFast, get_scheduler

from mutualrl.trainer.config.run import (
    BenchmarkSettings,
    GRPOSettings,
    PolicySettings,
    TrainerConfig,
)
from mutualrl.trainer.config.task import DatasetTaskConfig
from mutualrl.trainer.data.chat import PromptRenderer, renderer_for
from mutualrl.trainer.data.dataset_task import DatasetTask
from mutualrl.trainer.data.task_factory import make_task
from mutualrl.trainer.data.tasks import Prompt, Task
from mutualrl.trainer.engines.base import RolloutEngine
from mutualrl.trainer.engines.factory import make_engine
from mutualrl.trainer.model import lora
from mutualrl.trainer.runtime import checkpoint, dist_checkpoint
from mutualrl.trainer.runtime.allocator import AllocatorClient, RoundAllocation
from mutualrl.trainer.runtime.determinism import fix_kernels
from mutualrl.trainer.runtime.distributed import SINGLE, Dist, gathered, shard
from mutualrl.trainer.runtime.live_metrics import SeeMetricsReporter
from mutualrl.trainer.runtime.memory import (
    GIB,
    RolloutMemoryError,
    device_bytes,
    model_shape,
    policy_plan,
)
from mutualrl.trainer.runtime.metrics import MetricsSink
from mutualrl.trainer.runtime.preflight import (
    benchmark_tasks,
    check_benchmarks,
    max_new_tokens_field,
    policy_dir,
    prepare_dataset_task,
    problems_to_render,
    prompt_budget,
)
from mutualrl.trainer.runtime.presets import load_policy
from mutualrl.trainer.runtime.rollouts import (
    RolloutRequest,
    Rollouts,
    round_request,
    worker_spec,
)
from mutualrl.trainer.runtime.step import StepSettings, enable_activation_checkpointing
from mutualrl.trainer.sharing.exchange import PeerExchange
from mutualrl.trainer.sharing.probes import Probe, make_probe

log = logging.getLogger(__name__)


def compute_dtype(policy: PolicySettings) -> torch.dtype | None:
    """The lower-precision compute dtype of mixed precision (`compute_dtype` below `dtype`),
    or None when forward passes run in the parameters' dtype."""
    if policy.compute != policy.dtype:
        return getattr(torch, policy.compute)
    return None


def vllm_engine_kwargs(policy: PolicySettings, device: str, seed: int) -> dict[str, Any]:
    """`VLLMEngine`'s arguments from the policy's `vllm` settings: bf16 served from a float32
    master under mixed precision; each data-parallel rank seeds its own engine."""
    v = policy.vllm
    return {"policy": policy.name, "device": device, "dtype": v.dtype or policy.compute,
            "seed": seed, "max_model_len": v.max_model_len,
            "kv_cache_gib": v.kv_cache_gib, "gpu_memory_utilization": v.gpu_memory_utilization,
            "release_memory": v.release_memory, "enforce_eager": v.enforce_eager,
            **v.engine_args}


def hf_engine_kwargs(cfg: TrainerConfig, policy: PolicySettings, path: Path, device: str,
                     prompt_tokens: int) -> dict[str, Any]:
    """`HFEngine`'s arguments from the policy's `hf` settings and its memory plan on `device`
    (`runtime.memory.policy_plan`: what the fast path samples from, the static cache's
    budget). A round whose rollouts do not fit raises `RolloutMemoryError`, naming the fields
    that set its size, before round 0."""
    x, p = policy_plan(model_shape(path, policy.lora), cfg, policy, prompt_tokens,
                       device_bytes(policy, None, device))
    if p.rollout_peak > p.room:
        raise RolloutMemoryError(
            f"policy {policy.name}: a round of {x.rows} rollouts "
            f"(grpo.prompts_per_round x grpo.group_size) of up to {x.seq_tokens} tokens (the "
            f"longest prompt, {prompt_tokens}, + grpo.max_new_tokens) needs "
            f"{p.rollout_peak / GIB:.2f} GiB on {device}, {p.room / GIB:.2f} GiB usable: lower "
            "grpo.prompts_per_round, grpo.group_size or grpo.max_new_tokens "
            "(`mutualrl train --dry-run` prints the plan)")
    if not p.fits:
        log.warning("policy %s: %s", policy.name, "; ".join(p.problems))
    if x.hf_weights == "autocast" and policy.hf.sample_weights == "auto":
        log.info("policy %s: the HF engine samples under %s autocast: a %s copy of the weights "
                 "does not fit beside training", policy.name, policy.compute, policy.compute)
    hf = policy.hf
    return {"policy": policy.name, "fast_path": hf.fast_path, "cuda_graphs": x.hf_graphs,
            "stop_check_every": hf.stop_check_every, "weights": x.hf_weights,
            "compute_dtype": policy.compute if x.hf_weights != "master" else None,
            "window_tokens": hf.window_tokens,
            "kv_budget_bytes": p.room - (p.rollout_peak - p.items["kv_cache"])
            if x.hf_fast else None}


SCHEDULES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}
"""`grpo.lr_schedule` -> the name transformers' `get_scheduler` gives it."""


def make_scheduler(optimizer: torch.optim.Optimizer, g: GRPOSettings) -> LRScheduler:
    """The lr schedule over the run's rounds (one step a round): transformers' `get_scheduler`,
    a linear warm-up from 0 over `warmup_rounds`, then constant, linear to 0 or cosine to 0 at
    `rounds`."""
    return get_scheduler(SCHEDULES[g.lr_schedule], optimizer,
                         num_warmup_steps=g.warmup_rounds, num_training_steps=g.rounds)


@dataclass
class Session:
    cfg: TrainerConfig
    policy: PolicySettings
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerFast
    ref_model: torch.nn.Module | None
    """The frozen start (a second copy, or a LoRA policy's base) when beta or the KL
    diagnostic needs it."""
    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler
    engine: RolloutEngine
    task: Task
    probe: Probe
    exchange: PeerExchange | None
    allocator: AllocatorClient
    metrics: MetricsSink | NullMetrics
    run_dir: Path
    tokenizer_id: str
    max_new_tokens: int
    renderer: PromptRenderer
    """The policy's rendering of problems (its chat template, or plain text)."""
    rollouts: Rollouts
    """Where the round's rollouts come from: `engine` in-process, or a rollout worker."""
    base_dir: Path | None = None
    """The directory the policy's weights started from (a LoRA adapter's base)."""
    benchmarks: list[tuple[BenchmarkSettings, DatasetTask]] = field(default_factory=list)
    """(settings, problems) of each of `eval.benchmarks`."""
    start_round: int = 0
    dist: Dist = SINGLE
    """This process's rank among the policy's data-parallel ranks (`SINGLE`: one process)."""
    compute: torch.dtype | None = None
    """The dtype forward passes autocast to (mixed precision in one process); None: the
    parameters' own (also under FSDP2, whose MixedPrecisionPolicy casts instead)."""

    def render(self, prompts: Sequence[Prompt]) -> list[list[int]]:
        """The prompts in this policy's own rendering (token ids)."""
        return self.renderer.many(prompts)

    def rollout_request(self, k: int, alloc: RoundAllocation) -> RolloutRequest:
        """Round k's rollouts as the engine takes them (`runtime.rollouts.round_request`)."""
        return round_request(self.task, self.render, self.cfg.grpo, self.cfg.seed,
                             self.max_new_tokens, k, alloc)

    def step_settings(self) -> StepSettings:
        """The settings of the round's updates (runtime.step): the policy's config, tokenizer
        and ranks."""
        return StepSettings.of(self.cfg.grpo, self.cfg.probe, self.tokenizer.pad_token_id,
                               self.max_new_tokens, self.dist, self.compute)

    def shown(self, prompts: Sequence[Prompt]) -> list[str | None] | None:
        """The chat renderings of the prompts as text, for people (None: plain text)."""
        if not self.renderer.chat:
            return None
        return [self.renderer.text(p) for p in prompts]

    def save(self, rounds_done: int) -> Path:
        extra = {
            "probe": self.probe.state_dict(),
            "see_consumer": (self.exchange.consumer, self.exchange.last_delivery_id)
            if self.exchange else None,
            "policy": self.policy.name,
        }
        if isinstance(self.task, DatasetTask):  # the epoch position: resume keeps the order
            extra["data"] = self.task.state_dict(rounds_done, self.cfg.grpo.prompts_per_round,
                                                 self.cfg.seed)
        if self.dist.active:  # every rank writes its shards
            return dist_checkpoint.save(
                self.run_dir / "checkpoints", rounds_done, self.model, self.tokenizer,
                self.optimizer, self.scheduler, extra, self.cfg.checkpoint.keep, self.dist,
                base=self.base_dir)
        return checkpoint.save(self.run_dir / "checkpoints", rounds_done, self.model,
                               self.tokenizer, self.optimizer, self.scheduler, extra,
                               self.cfg.checkpoint.keep, base=self.base_dir)

    def close(self) -> None:
        self.rollouts.close()
        self.metrics.close()
        self.allocator.close()
        if self.exchange is not None:
            self.exchange.close()


class NullMetrics:
    """The metrics of ranks other than 0: rank 0 logs the round for the policy."""

    def log(self, round_k: int, values: dict[str, float]) -> None:
        pass

    def truncate_from(self, round_k: int) -> None:
        pass

    def close(self) -> None:
        pass


def _metrics_sink(cfg: TrainerConfig, policy: str, run_dir: Path) -> MetricsSink:
    reporter = None
    svc = cfg.services
    if cfg.metrics.see and not svc.local:  # the run exists by now (PeerExchange.join made it)

        reporter = SeeMetricsReporter(svc.see, cfg.run_id, policy, svc.token, svc.timeout)
    try:
        return MetricsSink(run_dir, policy, cfg.metrics, reporter, cfg.run_id,
                           cfg.model_dump(mode="json", exclude={"services": {"token"}}))
    except BaseException:  # e.g. metrics.wandb set without wandb installed
        if reporter is not None:
            reporter.close(timeout=0.1)
        raise


def build_session(
    cfg: TrainerConfig, policy_name: str | None = None, resume: bool = False,
    cache_dir: Path | None = None, dist: Dist = SINGLE, device: str | None = None,
) -> Session:
    """The session of one policy; with `dist` active, of this rank: the model is sharded over
    the ranks, and only rank 0 talks to SEE/THL/MWRA and writes metrics. `device` replaces
    the policy's (a rank's own GPU)."""
    # every policy's own rounds: a peer that trained its last round is not waited for
    peer_rounds = {p.name: cfg.for_policy(p.name).grpo.rounds for p in cfg.policies}
    cfg = cfg.for_policy(policy_name)  # the policy's own grpo / probe overrides applied
    policy = cfg.policy(policy_name)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    deterministic = cfg.exchange.mode == "deterministic"
    if deterministic:
        fix_kernels(policy.device if device is None else device)
    torch.set_num_threads(policy.threads)
    run_dir = cfg.run_dir(policy.name)
    cache = cache_dir or cfg.output_dir / "presets"

    # Rank 0 alone builds a missing preset: transformers' save_pretrained writes only on rank 0
    # once torch.distributed is up, so another rank's build would be an empty model directory.
    start = dist.from_main(lambda: policy_dir(policy, cache, cfg.seed))
    if dist.active and policy.lora is not None:
        raise ValueError(f"policy {policy.name}: lora with nproc > 1 is not supported yet "
                         "(FSDP2 shards full fine-tuning only); set nproc: 1 or drop lora")
    dev = device or policy.device
    model, tok = load_policy(start, policy.dtype, dev)
    if policy.lora is not None:
        model = lora.wrap(model, policy.lora)
    model.train()
    if cfg.grpo.activation_checkpointing:
        enable_activation_checkpointing(model)
    ref_model: torch.nn.Module | None = None
    # The frozen reference is the starting point, also after --resume; the KL-to-warm-start
    # diagnostic measures against the same copy. A LoRA policy's base is that point already.
    if cfg.grpo.beta > 0 or cfg.diagnostics.kl_every > 0:
        if policy.lora is not None:
            ref_model = lora.BaseReference(model)
        else:
            ref_model, _ = load_policy(start, policy.dtype, dev)
            ref_model.eval().requires_grad_(False)
    g = cfg.grpo

    def make_optimizer(m: torch.nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=g.lr,
                                 betas=g.adam_betas, weight_decay=g.weight_decay)

    last = checkpoint.latest(run_dir / "checkpoints") if resume else None
    plain_resume: tuple[dict[str, Any], dict[str, Any]] | None = None
    if dist.active:
        if last is not None and not dist_checkpoint.is_dcp(last):
            # A one-process checkpoint: load it whole, then shard it with the model.
            plain_resume = dist_checkpoint.plain_optimizer_state(
                last, model, make_optimizer, lambda opt: make_scheduler(opt, g))
        shard(model, compute_dtype(policy), dist.nodes if policy.sharding == "hsdp" else 1)
    optimizer = make_optimizer(model)
    scheduler = make_scheduler(optimizer, g)
    renderer = renderer_for(tok, policy)
    task = make_task(cfg.task) if not isinstance(cfg.task, DatasetTaskConfig) else \
        prepare_dataset_task(cfg, cache)
    max_new = g.max_new_tokens or task.max_new_tokens
    benchmarks = benchmark_tasks(cfg, task, cache)
    # Every problem rendered now: a chat template that does not render, or a prompt that does
    # not fit the model's context with its completion, stops the trainer before round 0.
    budget = prompt_budget(policy, renderer, problems_to_render(task, [t for _, t in benchmarks]),
                           max_new, Path(start), max_new_tokens_field(cfg))
    check_benchmarks(policy, renderer, benchmarks, max_new, Path(start))
    log.info("%s", budget.describe())
    engine_kw: dict[str, Any] = {}
    if policy.rollout_engine == "hf":
        engine_kw = hf_engine_kwargs(cfg, policy, Path(start), dev, budget.prompt_tokens)
    elif policy.rollout_engine == "sglang":
        sg = policy.sglang
        engine_kw = {"mem_fraction_static": sg.mem_fraction_static,
                     "release_memory": sg.release_memory, "dtype": policy.compute,
                     **sg.engine_args}
        if dist.active:  # each rank's engine on the rank's own GPU
            engine_kw.setdefault("base_gpu_id", torch.device(dev).index or 0)
    elif policy.rollout_engine == "vllm":
        engine_kw = vllm_engine_kwargs(policy, dev, cfg.seed + dist.rank)
    with gathered(model):  # the HF engine's copy and checks read the whole model
        engine = make_engine(policy.rollout_engine, model, tok, model_path=str(start),
                             **engine_kw)
    log.info("%s: rollouts on %s", policy.name, policy.rollout_engine)
    tokenizer_id = cfg.tokenizer_id(policy.name)
    rollouts = Rollouts(
        model, g.max_off_policy_steps, g.rounds, worker=policy.rollout_worker,
        spec=worker_spec(policy.name, Path(start), policy.dtype, dev, policy.lora,
                         policy.rollout_engine, engine_kw, policy.threads,
                         policy.rollout_worker_stall_s),
        exact=deterministic, dist=dist)
    exchange = None
    svc = cfg.services
    local = svc.local or not dist.main  # one rank talks to the services for the policy
    if not local:  # even probe `none` publishes: peers may read this policy
        exchange = PeerExchange(cfg.run_id, policy.name, tokenizer_id, svc.see, svc.thl, tok,
                                svc.token, svc.timeout, cfg.probe.tau,
                                outage_budget=svc.outage_budget_s,
                                reads_within_deadline=not deterministic,
                                max_failed_publishes=cfg.exchange.max_failed_publishes)
        # A THL service learns each tokenizer from its own trainer; the in-process engine
        # knows only what this process registers, so it gets every policy's.
        tokenizers = {tokenizer_id: str(start)} if svc.thl is not None else {
            cfg.tokenizer_id(p.name): str(policy_dir(p, cache, cfg.seed)) for p in cfg.policies}
        exchange.join([p.name for p in cfg.policies], tokenizers)
    allocator = AllocatorClient(
        None if local else svc.mwra, cfg.run_id, policy.name, policy.threads,
        g.group_size * g.prompts_per_round, svc.token, svc.timeout,
        peers=[p.name for p in cfg.policies], peers_wait_s=svc.peers_wait_s,
        fixed_compute=deterministic, outage_budget=svc.outage_budget_s,
        max_rollout_workers=0 if policy.rollout_worker is False else 1)
    session = Session(
        cfg=cfg, policy=policy, model=model, tokenizer=tok, ref_model=ref_model,
        optimizer=optimizer, scheduler=scheduler, engine=engine, task=task,
        probe=make_probe(cfg.probe, policy.name, exchange, task=task,
                         scale=cfg.grpo.scale_rewards, sharing=cfg.exchange),
        exchange=exchange,
        allocator=allocator,
        metrics=_metrics_sink(cfg, policy.name, run_dir) if dist.main else NullMetrics(),
        run_dir=run_dir, tokenizer_id=tokenizer_id, max_new_tokens=max_new,
        base_dir=Path(start).resolve(),  # export finds a LoRA adapter's base from any cwd
        renderer=renderer, benchmarks=benchmarks, dist=dist, rollouts=rollouts,
        compute=None if dist.active else compute_dtype(policy))
    session.probe.peer_rounds = peer_rounds
    if last is not None:
        if plain_resume is not None:
            named, state = plain_resume
            dist_checkpoint.load_full_optimizer(model, optimizer, named)
            scheduler.load_state_dict(state["scheduler"])
        elif dist_checkpoint.is_dcp(last):  # written by N ranks, read by any number
            state = dist_checkpoint.load(last, model, optimizer, scheduler)
        else:
            state = checkpoint.load(last, model, optimizer, scheduler)
        session.probe.load_state_dict(state.get("probe") or {})
        if isinstance(task, DatasetTask) and state.get("data"):
            task.load_state_dict(state["data"], int(state["round"]), g.prompts_per_round)
        if exchange is not None and state.get("see_consumer"):
            exchange.consumer, exchange.last_delivery_id = state["see_consumer"]
        session.start_round = int(state["round"])
        with gathered(model):
            engine.sync_weights(model)  # an engine with its own copy (SGLang) starts at `start`
        log.info("resumed %s from %s (round %d)", policy.name, last, session.start_round)
    # The rounds from here on run (again): rows a run logged past its checkpoint, or a
    # restart without one, would otherwise appear twice in metrics.jsonl.
    session.metrics.truncate_from(session.start_round)
    rollouts.begin(session.start_round)
    return session
