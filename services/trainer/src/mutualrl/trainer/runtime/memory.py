"""The memory plan of one policy's trainer (`mutualrl train --dry-run`): what a round holds on
its device, from the model's config alone (no weights loaded), against the device's size.

Two phases peak separately:

- rollout: weights + optimizer state (+ a frozen reference copy) stay resident while the
  engine samples: SGLang's or vLLM's share of the device (`sglang.mem_fraction_static`,
  `vllm.gpu_memory_utilization`: its copy of the weights and its KV cache), or the HF
  engine's KV cache for every row of the round at once;
- training: weights + gradients + optimizer state (+ reference) + the activations of one
  micro-batch + one logit chunk (+ under mixed precision in one process, autocast's
  compute-dtype casts of the weights, which a micro-batch holds from its forward into its
  backward), next to the engine's share, or only to what a released engine keeps
  (`sglang.release_memory`, `vllm.release_memory`).

The HF engine's fast path (`hf.fast_path`) holds its memory across rounds, so it counts in
both phases: its sampling copy of the weights in the compute dtype (`hf.sample_weights:
copy`), its static KV cache (the round's rows, a power of two with CUDA graphs, x the rollout
length rounded up to 64 tokens) and, with CUDA graphs, the graphs' pool, whose largest part is
the sampler's work on [rows, vocabulary] (the logits, their float32 copy, log-softmax,
probabilities and the truncation's product: `SAMPLER_BYTES` a row and entry, `SORT_BYTES` more
with top_p's sort). Without graphs the sampler's work is transient, in the rollout phase.

The micro-batch is the one a round can fill, not `grpo.micro_batch_tokens`: a step's rows (own
samples, and the probe's peer rows or demonstrations, split over `mini_batches` and the ranks)
at their longest, prompt + `max_new_tokens` each, as many as fit the token budget; the logit
chunk is at most that micro-batch's completion tokens. A CPU policy's device is host memory,
where the process itself (interpreter, torch and the libraries a trainer imports) holds a
share too: `runtime`, measured rather than estimated (`runtime_bytes`).

Each item is one entry of `MemoryPlan.items` and adds to the phases it is live in (`plan`): a
new resident term (an engine's own copy of the weights, a static cache) is one more entry and
one more addend.

The weights are the master weights (`policies[].dtype`): under mixed precision (float32
master, bf16 `compute_dtype`) parameters, gradients and AdamW's two moments are float32 and
only activations, FSDP2's gathered units and the engine's copy are bf16.

Estimates, per token and layer of a decoder (bytes b of the activation dtype): a checkpointed
layer keeps its input (h values); a layer in backward, or every layer without checkpointing,
holds about 8h + 2 kv + 4 ffn values (norm inputs/outputs, q, k, v, attention output, residual,
gate, up, activation, product), attention scores not materialised (SDPA). A logit chunk holds
the head's output (b), its float32 copy and the float32 gradient (4 + 4) per vocabulary entry.
AdamW keeps two moments in the parameter (master) dtype.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from mutualrl.trainer.config.run import LoraSettings, PolicySettings, TrainerConfig
from mutualrl.trainer.engines.static_decode import LENGTH_QUANTUM, pow2
from mutualrl.trainer.model.lora import wrap

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
_DTYPE_NAMES = {4: "float32", 2: "16-bit"}
RESERVE_BYTES = GIB
"""CUDA context and allocator slack, beside `RESERVE_FRACTION` of the device."""
RESERVE_FRACTION = 0.05
RELEASED_ENGINE_BYTES = 2 * GIB
"""What a released SGLang or vLLM engine still holds (CUDA graphs, buffers, its context)."""
POOLED_ENGINES = ("sglang", "vllm")
"""Engines that take a share of the device for their own weights and KV cache."""
SAMPLER_BYTES = 20
"""Bytes per row and vocabulary entry the HF engine's draw holds at once (see the module
docstring)."""
SORT_BYTES = 20
"""Bytes per row and entry top_p's sort adds (values, int64 indices, their cumulative sum)."""


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs from a model's config."""

    params: int
    """Parameters (tied embeddings once)."""
    trainable: int
    """Parameters that get gradients and optimizer state (LoRA: the adapters)."""
    hidden: int
    layers: int
    ffn: int
    kv_heads: int
    head_dim: int
    vocab: int


@dataclass(frozen=True)
class PlanInputs:
    """The config fields the plan reads (one policy, its overrides applied)."""

    dtype_bytes: int
    """Bytes of a master weight (`policies[].dtype`): parameters, gradients, AdamW moments."""
    act_bytes: int
    """Compute bytes (`policies[].compute_dtype`): activations, FSDP2's gathered units."""
    micro_batch_tokens: int
    logit_chunk_tokens: int
    activation_checkpointing: bool
    reference_copy: bool
    """A frozen full copy for the KL / diagnostics (not with LoRA: its base is the reference)."""
    rows: int
    """Rollouts per round (prompts_per_round x group_size)."""
    seq_tokens: int
    """Prompt allowance + max_new_tokens: one rollout's length."""
    engine: str
    mem_fraction_static: float
    """The engine's share of the device (SGLang's `mem_fraction_static`, vLLM's
    `gpu_memory_utilization`)."""
    release_memory: bool
    nproc: int = 1
    """Data-parallel ranks on a node (`policies[].nproc`); the plan is then one rank's (one
    device's)."""
    nnodes: int = 1
    """Nodes of the policy (`policies[].nnodes`), `nproc` ranks on each."""
    hsdp: bool = False
    """`policies[].sharding: hsdp`: the state is sharded over a node's ranks only."""
    engine_bytes: int = 0
    """Bytes of a weight in the engine's own copy (bf16 when served from an fp32 master);
    0: the master's."""
    engine_pool_bytes: int | None = None
    """An explicit engine share in bytes (vLLM on a CPU: `vllm.kv_cache_gib` + its copy of
    the weights), instead of a fraction of the device."""
    train_rows: int | None = None
    """Rows one optimizer step scores on one rank: own samples plus the probe's rows at most,
    over `mini_batches` and the ranks (None: `rows`)."""
    max_new_tokens: int | None = None
    """Completion budget of a row (None: `seq_tokens`): bounds a micro-batch's logit chunk."""
    runtime_bytes: int = 0
    """What the process holds before any model: interpreter and libraries (CPU: host memory
    is the device)."""
    hf_fast: bool = False
    """The HF engine's fast path: its static cache (and copy, and graphs) stay resident."""
    hf_weights: str = "master"
    """What the fast path samples from: `master`, `copy` (a compute-dtype copy) or
    `autocast`."""
    hf_graphs: bool = False
    """CUDA graphs: the batch is a power of two and the sampler's work stays in their pool."""
    sampler_sort: bool = False
    """top_p < 1: the draw sorts the vocabulary."""

    @property
    def ranks(self) -> int:
        """Every rank of the policy (`nnodes x nproc`): each samples its share of a round."""
        return max(1, self.nproc) * max(1, self.nnodes)

    @property
    def shards(self) -> int:
        """Ranks one copy of the state is sharded over: all of them (FSDP2), or a node's
        (HSDP)."""
        return max(1, self.nproc) if self.hsdp else self.ranks

    def sharding(self) -> str:
        """How the state spreads over the ranks, in words."""
        if self.ranks == 1:
            return "one device, optimizer state on it"
        nodes = f"{self.nnodes} nodes x {self.nproc}" if self.nnodes > 1 else f"{self.nproc}"
        if self.hsdp and self.nnodes > 1:
            return (f"HSDP: sharded over a node's {self.nproc} devices, replicated over "
                    f"{self.nnodes} nodes ({self.ranks} ranks)")
        return f"FSDP2 over {self.ranks} devices ({nodes} ranks, one device each)"

    def micro_rows(self) -> int:
        """Rows of the largest micro-batch a round fills (0: one row does not fit)."""
        rows = self.rows if self.train_rows is None else self.train_rows
        return max(0, min(rows, self.micro_batch_tokens // max(self.seq_tokens, 1)))

    def micro_tokens(self) -> int:
        """Padded tokens of that micro-batch (what its activations scale with)."""
        return self.micro_rows() * self.seq_tokens

    def logit_tokens(self) -> int:
        """Completion positions of one logit chunk of that micro-batch."""
        new = self.seq_tokens if self.max_new_tokens is None else self.max_new_tokens
        return min(self.logit_chunk_tokens, max(self.micro_rows(), 1) * new)


@dataclass
class MemoryPlan:
    """Bytes per item, the two phase peaks and the verdict against `device_bytes`."""

    items: dict[str, int]
    rollout_peak: int
    train_peak: int
    device_bytes: int
    reserve: int
    kv_bytes_per_token: int
    kv_pool_bytes: int
    rows_at_once: int
    problems: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def room(self) -> int:
        """What the plan may use: the device less the reserve."""
        return self.device_bytes - self.reserve


def kv_bytes_per_token(shape: ModelShape, dtype_bytes: int) -> int:
    """K and V of every layer for one token."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * dtype_bytes


def layer_activation_values(shape: ModelShape) -> int:
    """Values one layer holds per token for its backward (see the module docstring)."""
    return 8 * shape.hidden + 2 * shape.kv_heads * shape.head_dim + 4 * shape.ffn


def plan(shape: ModelShape, x: PlanInputs, device_bytes: int) -> MemoryPlan:
    """The memory plan of one policy on a device of `device_bytes`."""
    b, a = x.dtype_bytes, x.act_bytes
    n, s = x.ranks, x.shards
    full = shape.params * b
    # FSDP2 (several ranks): each rank holds 1/s of weights, gradients and optimizer state
    # (s: every rank, or a node's with HSDP); the root unit (embeddings, a tied head) stays
    # gathered from forward to backward and one block is gathered at a time, with their
    # unsharded gradients before the reduce-scatter.
    weights = -(-full // s)
    grads = -(-shape.trainable * b // s)
    optim = -(-2 * shape.trainable * b // s)
    block = max(shape.params - shape.vocab * shape.hidden, 0) // max(shape.layers, 1)
    gathered = 2 * (shape.vocab * shape.hidden + block) * a if n > 1 else 0
    rollout_weights = full if n > 1 else 0  # sampling and the sync gather the whole model
    rows = -(-x.rows // n)  # each rank samples its share
    reference = full if x.reference_copy else 0
    tokens = x.micro_tokens()
    per_layer = layer_activation_values(shape) * tokens * a
    if x.activation_checkpointing:
        acts = shape.layers * shape.hidden * tokens * a + per_layer
    else:
        acts = shape.layers * per_layer
    logits = x.logit_tokens() * shape.vocab * (a + 8)
    # A pooled engine's KV cache is in the dtype it serves; the HF engine's in the weights'.
    kv_tok = kv_bytes_per_token(shape, (x.engine_bytes or b) if x.engine in POOLED_ENGINES
                                else b)
    round_kv = rows * x.seq_tokens * kv_tok
    # Mixed precision in one process: a micro-batch's forward holds autocast's casts of every
    # weight (the cast cache, then the tensors saved for backward); FSDP2 counts `gathered`.
    casts = shape.params * a if a < b and n == 1 else 0
    items = {"weights": weights, "gradients": grads, "optimizer": optim,
             "reference": reference, "activations": acts, "logit_chunk": logits}
    if casts:
        items["autocast_casts"] = casts
    if n > 1:
        items["gathered"] = gathered
    if x.runtime_bytes:
        items["runtime"] = x.runtime_bytes
    resident = x.runtime_bytes + weights + optim + reference
    problems: list[str] = []
    if x.micro_rows() < 1:
        problems.append(f"grpo.micro_batch_tokens={x.micro_batch_tokens} cannot hold one row "
                        f"of {x.seq_tokens} tokens (longest prompt + max_new_tokens): raise "
                        "grpo.micro_batch_tokens")
    if x.engine in POOLED_ENGINES:
        copy = shape.params * (x.engine_bytes or b)
        if x.engine_pool_bytes is not None:
            static = x.engine_pool_bytes + copy
            pool = x.engine_pool_bytes
        else:
            static = int(x.mem_fraction_static * device_bytes)
            # The engine starts after the trainer loaded its weights; its KV pool is what is
            # left of its share once those and its own copy of the weights are counted.
            pool = static - weights - reference - copy
        rows_at_once = min(rows, max(pool, 0) // max(x.seq_tokens * kv_tok, 1))
        items["engine"] = static
        items["kv_cache"] = max(pool, 0)
        rollout = resident + rollout_weights + static
        train = resident + gathered + grads + acts + logits + casts + (
            RELEASED_ENGINE_BYTES if x.release_memory else static)
        if rows_at_once < 1:
            problems.append(
                f"{_ENGINE_NAMES[x.engine]}'s KV pool ({_gib(pool)}) cannot hold one rollout "
                f"of {x.seq_tokens} tokens: raise {_share_field(x)}")
    elif x.engine == "hf" and x.hf_fast:
        # The fast path's copy, static cache and graphs are held across rounds.
        served = b if x.hf_weights == "master" else a
        pool_rows = pow2(rows) if x.hf_graphs else rows
        length = -(-x.seq_tokens // LENGTH_QUANTUM) * LENGTH_QUANTUM
        pool = pool_rows * length * kv_bytes_per_token(shape, served)
        rows_at_once = rows
        sampler = pool_rows * shape.vocab * (SAMPLER_BYTES + SORT_BYTES * x.sampler_sort)
        copy = shape.params * a if x.hf_weights == "copy" else 0
        items["kv_cache"] = pool
        items["sampler"] = sampler
        if copy:
            items["sampling_copy"] = copy
        held = copy + pool + (sampler if x.hf_graphs else 0)
        rollout = resident + rollout_weights + copy + pool + sampler
        train = resident + gathered + grads + acts + logits + casts + held
    else:
        pool = round_kv
        rows_at_once = rows
        items["kv_cache"] = round_kv
        rollout = resident + rollout_weights + round_kv
        train = resident + gathered + grads + acts + logits + casts
    reserve = RESERVE_BYTES + int(RESERVE_FRACTION * device_bytes)
    room = device_bytes - reserve
    if train > room:
        fix = ["grpo.micro_batch_tokens", "grpo.logit_chunk_tokens"]
        if not x.activation_checkpointing:
            fix.append("grpo.activation_checkpointing: true")
        if x.engine in POOLED_ENGINES and not x.release_memory:
            fix.append(f"policies[].{x.engine}.release_memory: true")
        if x.engine in POOLED_ENGINES:
            fix.append(_share_field(x))
        if x.engine == "hf" and x.hf_fast:  # its static cache (and copy) stay resident
            fix += list(ROUND_FIELDS)
            if x.hf_weights == "copy":
                fix.append("policies[].hf.sample_weights: autocast")
        fix += _sharding_fixes(x)
        fix.append("policies[].lora")
        problems.append(f"training needs {_gib(train)} of {_gib(room)} usable: lower or set "
                        + ", ".join(fix))
    if rollout > room:
        fix = ([_share_field(x)] if x.engine in POOLED_ENGINES
               else list(ROUND_FIELDS))
        fix += _sharding_fixes(x)
        fix.append("policies[].lora")
        problems.append(f"rollouts need {_gib(rollout)} of {_gib(room)} usable: lower "
                        + ", ".join(fix))
    return MemoryPlan(items=items, rollout_peak=rollout, train_peak=train,
                      device_bytes=device_bytes, reserve=reserve, kv_bytes_per_token=kv_tok,
                      kv_pool_bytes=max(pool, 0), rows_at_once=int(rows_at_once),
                      problems=problems)


ENGINE_ITEMS = ("engine", "kv_cache", "sampler", "sampling_copy")
"""The plan's items that belong to the rollout engine (a rollout worker's, when it has one)."""


def worker_plan(shape: ModelShape, x: PlanInputs, p: MemoryPlan, slots: int
                ) -> dict[str, int]:
    """Bytes of a policy's rollout worker (`policies[].rollout_worker`) beside its learner on
    the same device: its own copy of the weights, its engine's items of `p`, its process's
    runtime, and the ring of `slots` (max(1, grpo.max_off_policy_steps)) published copies of
    the trainable weights the two share."""
    out = {"worker_weights": shape.params * x.dtype_bytes,
           **{f"worker_{k}": p.items[k] for k in ENGINE_ITEMS if k in p.items},
           "weight_ring": slots * shape.trainable * x.dtype_bytes}
    if x.runtime_bytes:
        out["worker_runtime"] = x.runtime_bytes
    return out


def _sharding_fixes(x: PlanInputs) -> list[str]:
    """More devices for the state: a second rank on the node, all nodes' ranks for HSDP's
    shards, or twice the nodes."""
    fix = []
    if x.nproc == 1:
        fix.append("policies[].nproc: 2 (FSDP2 shards weights, gradients and moments)")
    if x.hsdp and x.nnodes > 1:
        fix.append(f"policies[].sharding: fsdp (shards over all {x.ranks} ranks, not a "
                   f"node's {x.nproc})")
    else:
        fix.append(f"policies[].nnodes: {2 * x.nnodes} (FSDP2 over {2 * x.ranks} ranks on "
                   "as many machines' devices)")
    return fix


_ENGINE_NAMES = {"sglang": "SGLang", "vllm": "vLLM"}
ROUND_FIELDS = ("grpo.prompts_per_round", "grpo.group_size", "grpo.max_new_tokens")
"""What sets a round's rows x length (the longest prompt aside)."""


def _share_field(x: PlanInputs) -> str:
    if x.engine == "vllm":
        return ("policies[].vllm.kv_cache_gib" if x.engine_pool_bytes is not None
                else "policies[].vllm.gpu_memory_utilization")
    return "policies[].sglang.mem_fraction_static"


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def render(name: str, p: MemoryPlan, x: PlanInputs, shape: ModelShape) -> str:
    """The plan as a few aligned lines."""
    per_rank = f", 1/{x.shards} per rank" if x.ranks > 1 else ""
    master = f"{_DTYPE_NAMES[x.dtype_bytes]} master"
    rows = [
        ("parameters", p.items["weights"],
         f"{shape.params:,} x {x.dtype_bytes} B ({master}){per_rank}"),
        ("gradients", p.items["gradients"], f"{shape.trainable:,} trainable, {master}"),
        ("optimizer state", p.items["optimizer"], f"AdamW, 2 moments, {master}"),
        ("reference copy", p.items["reference"],
         "frozen copy" if x.reference_copy else "none (beta 0, or LoRA base)"),
        ("activations / micro-batch", p.items["activations"],
         f"{x.micro_tokens():,} tokens ({x.micro_rows():,} rows x {x.seq_tokens:,}; budget "
         f"{x.micro_batch_tokens:,}), checkpointing "
         f"{'on' if x.activation_checkpointing else 'off'}"),
        ("logit chunk", p.items["logit_chunk"],
         f"{x.logit_tokens():,} tokens x {shape.vocab:,} vocab"),
        ("KV cache", p.items["kv_cache"],
         f"{p.kv_bytes_per_token:,} B/token; {p.rows_at_once:,} of {-(-x.rows // x.ranks):,} "
         f"rollouts of {x.seq_tokens:,} tokens at once"
         + ("; static, held across rounds" if x.engine == "hf" and x.hf_fast else "")),
    ]
    if "autocast_casts" in p.items:
        rows.append(("autocast casts", p.items["autocast_casts"],
                     f"{_DTYPE_NAMES[x.act_bytes]} casts of the weights in a micro-batch"))
    if "sampling_copy" in p.items:
        rows.append(("sampling copy", p.items["sampling_copy"],
                     f"the HF engine's {_DTYPE_NAMES[x.act_bytes]} weights, synced each step"))
    if "sampler" in p.items:
        rows.append(("sampler", p.items["sampler"],
                     "rows x vocabulary, " + ("in the CUDA graphs' pool" if x.hf_graphs
                                              else "while sampling")
                     + f"; weights: {x.hf_weights}"))
    if "gathered" in p.items:
        rows.append(("gathered units", p.items["gathered"],
                     "root (embeddings, head) + one block, with their gradients; sampling "
                     "gathers the whole model"))
    if "engine" in p.items:
        engine = _ENGINE_NAMES[x.engine]
        share = (f"{_share_field(x).rsplit('.', 1)[1]} {x.mem_fraction_static}"
                 if x.engine_pool_bytes is None else "explicit KV size")
        copy = _DTYPE_NAMES[x.engine_bytes or x.dtype_bytes]
        rows.append((f"{engine} pool", p.items["engine"],
                     f"{share}, its weights in {copy}, released in training: "
                     f"{'yes' if x.release_memory else 'no'}"))
    if "runtime" in p.items:
        rows.insert(0, ("runtime", p.items["runtime"],
                        "interpreter and libraries (measured in this process)"))
    out = [f"policy {name}: device {_gib(p.device_bytes)} "
           f"(reserve {_gib(p.reserve)} for context and fragmentation)"]
    out += [f"  {k:<26}{v / GIB:>9.2f} GiB  {note}" for k, v, note in rows]
    out.append(f"  {'peak, rollouts':<26}{p.rollout_peak / GIB:>9.2f} GiB")
    out.append(f"  {'peak, training':<26}{p.train_peak / GIB:>9.2f} GiB")
    out.append(f"  fits: {x.sharding()}" if p.fits else "  DOES NOT FIT: " + "; ".join(p.problems))
    return "\n".join(out)


def model_shape(path: str | Path, lora: LoraSettings | None = None) -> ModelShape:
    """The shape of the model saved at `path`, from its config: parameters are counted on the
    meta device (nothing is allocated or read), LoRA adapters added as `lora` would add them."""
    cfg = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    params = sum(p.numel() for p in model.parameters())
    trainable = params
    if lora is not None:
        peft_model = wrap(model, lora)
        trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    hidden = int(getattr(text, "hidden_size", 0) or getattr(text, "n_embd", 0))
    heads = int(getattr(text, "num_attention_heads", 0) or getattr(text, "n_head", 0))
    head_dim = int(getattr(text, "head_dim", 0) or hidden // max(heads, 1))
    return ModelShape(
        params=params, trainable=trainable, hidden=hidden,
        layers=int(getattr(text, "num_hidden_layers", 0) or getattr(text, "n_layer", 0)),
        ffn=int(getattr(text, "intermediate_size", 0) or getattr(text, "n_inner", None)
                or 4 * hidden),
        kv_heads=int(getattr(text, "num_key_value_heads", 0) or heads), head_dim=head_dim,
        vocab=int(text.vocab_size))


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
                runtime_bytes: int = 0, hf_weights: str = "master") -> PlanInputs:
    """What the plan reads from `cfg` (the policy's own grpo overrides applied already);
    `hf_weights`: what the HF engine's fast path samples from (`sample_weights_choices`)."""
    g = cfg.grpo
    b = DTYPE_BYTES[policy.dtype]
    on_cuda = policy.device.startswith("cuda")
    max_new = g.max_new_tokens or getattr(cfg.task, "max_new_tokens", None) or 256
    rows = g.prompts_per_round * g.group_size
    # One step's mini-batch, split over the ranks (each scores its block of the rows).
    step_rows = -(-(rows + probe_rows(cfg)) // (g.mini_batches * policy.ranks))
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
    hf = policy.hf
    return PlanInputs(
        dtype_bytes=b, act_bytes=compute,
        micro_batch_tokens=g.micro_batch_tokens, logit_chunk_tokens=g.logit_chunk_tokens,
        activation_checkpointing=g.activation_checkpointing,
        reference_copy=policy.lora is None and (g.beta > 0 or cfg.diagnostics.kl_every > 0),
        rows=rows, seq_tokens=prompt_tokens + max_new,
        engine=policy.rollout_engine, mem_fraction_static=share, release_memory=release,
        nproc=policy.nproc, nnodes=policy.nnodes, hsdp=policy.sharding == "hsdp",
        engine_bytes=served, engine_pool_bytes=pool,
        train_rows=step_rows, max_new_tokens=max_new,
        runtime_bytes=0 if on_cuda else runtime_bytes,
        hf_fast=policy.rollout_engine == "hf" and hf.fast_path, hf_weights=hf_weights,
        hf_graphs=hf_graphs(policy, hf_weights), sampler_sort=g.top_p < 1.0)


def hf_graphs(policy: PolicySettings, weights: str) -> bool:
    """Whether the HF engine replays CUDA graphs: on CUDA, asked for, and over weights whose
    addresses hold still (its own copy, or one process's module; FSDP2 gathers anew)."""
    return (policy.device.startswith("cuda") and policy.hf.fast_path and policy.hf.cuda_graphs
            and (weights == "copy" or policy.ranks == 1))


def sample_weights_choices(policy: PolicySettings) -> list[str]:
    """What the HF engine may sample from, best first (`hf.sample_weights`; auto: a
    compute-dtype copy on CUDA under mixed precision or FSDP2, else autocast or the master)."""
    asked = policy.hf.sample_weights
    if asked != "auto":
        return [asked]
    if not policy.device.startswith("cuda"):
        return ["master"]
    lower = policy.compute != policy.dtype
    if lower or policy.ranks > 1:
        return ["copy", "autocast" if lower else "master"]
    return ["master"]


def policy_plan(shape: ModelShape, cfg: TrainerConfig, policy: PolicySettings,
                prompt_tokens: int, size: int, runtime_bytes: int = 0
                ) -> tuple[PlanInputs, MemoryPlan]:
    """The policy's inputs and plan on a device of `size` bytes: for the HF engine with the
    first of its sampling choices that fits (the last when none does)."""
    choices = sample_weights_choices(policy) if policy.rollout_engine == "hf" else ["master"]
    for weights in choices:
        x = plan_inputs(cfg, policy, prompt_tokens, runtime_bytes, weights)
        p = plan(shape, x, size)
        if p.fits:
            break
    return x, p


def device_bytes(policy: PolicySettings, device_memory_gb: float | None,
                 device: str | None = None) -> int:
    """The size to plan against: the flag, else the CUDA device's memory (`device`: a rank's
    own, instead of the policy's), else host RAM for a CPU policy; a CUDA policy planned on a
    machine without that device needs the flag."""
    if device_memory_gb is not None:
        return int(device_memory_gb * GIB)
    dev = device or policy.device
    if dev.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"policy {policy.name} runs on {dev} and no CUDA device "
                             "is visible here: give --device-memory-gb")
        index = torch.device(dev).index or 0
        return int(torch.cuda.get_device_properties(index).total_memory)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class RolloutMemoryError(ValueError):
    """A round's rollouts do not fit the device (refused before round 0)."""


ALLOCATOR_SETTINGS = "expandable_segments:True"
"""The CUDA caching allocator's setting for trainers: segments grow in place, so memory a
round's shapes free is reused by the next shapes instead of staying reserved."""


def set_allocator(environ: MutableMapping[str, str] | None = None) -> None:
    """Give this process `ALLOCATOR_SETTINGS` unless the environment sets the allocator
    already (PYTORCH_CUDA_ALLOC_CONF or PYTORCH_ALLOC_CONF); before CUDA is first used."""
    env = os.environ if environ is None else environ
    if not env.get("PYTORCH_CUDA_ALLOC_CONF") and not env.get("PYTORCH_ALLOC_CONF"):
        env["PYTORCH_CUDA_ALLOC_CONF"] = ALLOCATOR_SETTINGS
