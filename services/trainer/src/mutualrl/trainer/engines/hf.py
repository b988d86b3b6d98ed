"""`HFEngine` — sampling over any `transformers` causal LM in the trainer's process (CPU or GPU).
Written by hand rather than through `model.generate` because it needs exactly three things
`generate` does not give cheaply: the log-prob of each sampled token under the
temperature-scaled distribution, character offsets of each completion token, and stop-string
checks that do not decode every row at every step. It keeps the conventions of
`engines.base` (the other engines: `engines.vllm`, `engines.sglang`).

Two loops, one contract:

- **The fast path** (`engines.static_decode`, the default): a static KV cache sized per call
  and reused across rounds, the loop's state on the device, the decode step captured as CUDA
  graphs on a GPU, stop strings checked every `stop_check_every` steps and cut at the exact
  stop, tokens drawn by `engines.sampling` from a counter-based generator keyed by (prompt
  seed, sample, step). On a CPU the same code runs eagerly.
- **The dynamic-cache loop** (`_generate_dynamic`): a `DynamicCache`, finished rows dropped
  from the batch at each step, one `torch.Generator` per prompt. It serves the models the fast
  path cannot (a layer type its pool does not hold, a forward without transformers' cache
  arguments: the engine says which and why, once, when it is built) and `hf.fast_path: false`.

Either way a prompt's samples depend on its own seed only; the two loops draw different
samples from the same seed.

What the fast path samples from (`weights`): the trainer's module itself (`master`); a copy of
the weights in the compute dtype, refreshed by every `sync_weights` (`copy`: bf16 sampling
from a float32 master, LoRA adapters merged, FSDP2's gathered weights held still for graphs);
or the master under autocast to the compute dtype (`autocast`, where a copy does not fit).
The runtime chooses from the memory plan (`runtime.session`).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import Tensor
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

from mutualrl.trainer.engines.base import (
    Sample,
    check_request,
    completion_offsets,
    encode_prompt,
    prompt_seed,
)
from mutualrl.trainer.engines.sampling import draw, row_keys
from mutualrl.trainer.engines.static_decode import (
    Sampling,
    StaticDecoder,
    cache_kwarg,
    cache_of,
    prefill,
    static_cache_problem,
)
from mutualrl.trainer.model.lora import sync_tensors

log = logging.getLogger(__name__)

WEIGHTS = ("master", "copy", "autocast")
CPU_CHECK_EVERY = 1
"""Steps between host checks on a CPU, where reading the device costs nothing."""
CUDA_CHECK_EVERY = 8
"""Steps between host checks on a GPU: each check is one synchronisation."""


class HFEngine:
    """Batched sampling over a `transformers` causal LM (see the module docstring).

    With `weights="master"` the engine samples from the live module, so after an optimizer
    step it already samples from the new weights; `sync_weights` swaps which module it uses
    (and refreshes a `copy`).
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast, *,
                 policy: str = "policy", fast_path: bool = True, cuda_graphs: bool = True,
                 stop_check_every: int | None = None, weights: str = "master",
                 compute_dtype: str | None = None, window_tokens: int = 128,
                 kv_budget_bytes: int | None = None) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise TypeError("HFEngine needs a fast tokenizer (character offsets)")
        if weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
        if weights != "master" and compute_dtype is None:
            raise ValueError(f"weights={weights!r} needs compute_dtype")
        self.model = model
        self.tokenizer = tokenizer
        self.policy = policy
        self.weights = weights
        self.compute_dtype = getattr(torch, compute_dtype) if compute_dtype else None
        self._stop_cache: dict[tuple[str, ...], Tensor] = {}
        self._copy: PreTrainedModel | None = None
        self.decoder: StaticDecoder | None = None
        self.fallback_reason: str | None = None
        if self.compute_dtype is not None and weights == "copy":
            self._copy = sampling_copy(model, self.compute_dtype)
        if not fast_path:
            return
        device = _device_of(model)
        reason = static_cache_problem(self._sampler(),
                                      self.compute_dtype if weights == "autocast" else None)
        if reason is not None:
            self.fallback_reason = reason
            log.warning("policy %s: the HF engine samples with its dynamic-cache loop, not the "
                        "fast path: %s", policy, reason)
            return
        every = stop_check_every or (CUDA_CHECK_EVERY if device.type == "cuda"
                                     else CPU_CHECK_EVERY)
        self.decoder = StaticDecoder(device, cuda_graphs, every, window_tokens, kv_budget_bytes,
                                     policy)

    def _sampler(self) -> PreTrainedModel:
        """The module the fast path runs: the copy, or the trainer's own."""
        return self._copy if self._copy is not None else self.model

    def _autocast(self) -> AbstractContextManager[Any]:
        if self.weights != "autocast":
            return nullcontext()
        # No cast cache: in a graph every replay must cast the current master weights.
        return torch.autocast(_device_of(self.model).type, dtype=self.compute_dtype,
                              cache_enabled=False)

    def sync_weights(self, model: PreTrainedModel) -> None:
        """Sample from `model` from now on: the trainer's own module, or (`copy`) its current
        weights copied into the engine's copy in place (graphs keep their addresses)."""
        self.model = model
        if self._copy is not None:
            refresh_copy(self._copy, model)

    def release_memory(self) -> None:
        """Nothing is released: the static cache, the copy and the graphs stay for the next
        round (the memory plan counts them in training too)."""

    def stats(self) -> dict[str, float]:
        """The fast path's counters so far (graph captures and replays, pool allocations,
        host checks) and whether it runs."""
        out = {"fast_path": float(self.decoder is not None)}
        if self.decoder is not None:
            out.update(self.decoder.stats)
        return out

    def _stop_candidates(self, stop: tuple[str, ...]) -> Tensor:
        """Bool mask over the vocabulary: tokens after which a stop string can be complete.

        A stop string ends in some character; only a token whose decoding contains that
        character (or an incomplete byte sequence) can complete it, so only rows that just
        sampled such a token need decoding. Cached per stop set.
        """
        if stop not in self._stop_cache:
            vocab = self.model.get_output_embeddings().weight.shape[0]
            pieces = self.tokenizer.backend_tokenizer.decode_batch(
                [[i] for i in range(vocab)], skip_special_tokens=False)
            last = {s[-1] for s in stop if s}
            mask = [any(c in piece for c in last) or "\ufffd" in piece for piece in pieces]
            self._stop_cache[stop] = torch.tensor(mask, dtype=torch.bool)
        return self._stop_cache[stop]

    def generate(self, prompts: Sequence[str | Sequence[int]], n: int, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0, stop: list[str] | None = None,
                 seed: int | None = None, seeds: list[int] | None = None, top_k: int = 0,
                 min_p: float = 0.0) -> list[list[Sample]]:
        """`n` samples per prompt; rows of one prompt are adjacent (prompt-major order)."""
        check_request(prompts, n, max_new_tokens, seeds, top_p, top_k, min_p)
        if not prompts:
            return []
        model, tok = self._sampler(), self.tokenizer
        device = _device_of(model)
        stop_t = tuple(s for s in (stop or []) if s)
        eos = tok.eos_token_id
        pad = tok.pad_token_id if tok.pad_token_id is not None else (eos or 0)

        prompt_ids = [encode_prompt(tok, p) for p in prompts]
        width = max(len(r) for r in prompt_ids)
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attn = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, r in enumerate(prompt_ids):  # left padding keeps every row's last token at -1
            input_ids[i, width - len(r):] = torch.tensor(r)
            attn[i, width - len(r):] = 1
        input_ids, attn = input_ids.to(device), attn.to(device)
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        stop_mask = self._stop_candidates(stop_t) if stop_t else None
        truncation = (top_k, top_p, min_p)

        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                if self.decoder is not None:
                    if seeds is None:  # one call seed: prompt i draws as if seeded (seed, i)
                        base = seed if seed is not None else random.getrandbits(63)
                        seeds = [prompt_seed(base, 0, i) for i in range(len(prompts))]

                    def ends_in_stop(ids: list[int], step: int) -> bool:
                        text = tok.decode(ids[: step + 1], skip_special_tokens=True)
                        return any(st in text for st in stop_t)

                    out = self.decoder.run(
                        model, input_ids, attn, positions, n, max_new_tokens,
                        Sampling(temperature, truncation, eos), row_keys(seeds, n),
                        ends_in_stop if stop_t else None, stop_mask, self._autocast)
                    rows = list(zip(out.tokens, out.logps, out.finished, strict=True))
                else:
                    with self._autocast():
                        rows = _generate_dynamic(
                            model, input_ids, attn, positions, n, max_new_tokens,
                            temperature, truncation, seed, seeds, eos, pad, stop_t, stop_mask,
                            tok)
        finally:
            model.train(was_training)

        result: list[list[Sample]] = [[] for _ in prompts]
        for i, (ids, logps, finished) in enumerate(rows):
            text, offsets = completion_offsets(tok, ids)
            result[i // n].append(Sample(prompt_index=i // n, token_ids=ids, text=text,
                                         offsets=offsets, logprobs=logps,
                                         finish_reason="stop" if finished else "length",
                                         prompt_token_ids=prompt_ids[i // n]))
        return result


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def sampling_copy(model: PreTrainedModel, dtype: torch.dtype) -> PreTrainedModel:
    """A module of `model`'s base architecture with parameters in `dtype` (LoRA adapters
    merged in at each sync) and buffers as the trainer's (rotary frequencies stay float32),
    holding `model`'s current weights. Built on the meta device: nothing is copied twice."""
    get_base = getattr(model, "get_base_model", None)
    base = get_base() if callable(get_base) else model
    device = _device_of(model)
    with torch.device("meta"):
        copy = AutoModelForCausalLM.from_config(
            base.config, attn_implementation=base.config._attn_implementation)
    copy.to_empty(device=device)
    copy.tie_weights()  # a model built on the meta device is not tied yet
    with torch.no_grad():
        for p in copy.parameters():
            p.data = torch.empty_like(p, dtype=dtype)
        buffers = dict(base.named_buffers())
        for name, buf in copy.named_buffers():
            if name not in buffers:
                raise ValueError(f"the sampling copy has a buffer {name} the model lacks")
            buf.data = buffers[name].detach().clone()
    copy.requires_grad_(False).eval()
    names = {name for name, _ in copy.named_parameters()}
    synced = {name for name, _ in sync_tensors(model)}
    if names != synced:
        raise ValueError("the sampling copy's parameters are not the model's: "
                         f"{sorted(names ^ synced)[:4]}")
    refresh_copy(copy, model)
    return copy


def refresh_copy(copy: torch.nn.Module, model: torch.nn.Module) -> None:
    """`model`'s current weights (LoRA adapters merged) into `copy`'s parameters, in place and
    cast to their dtype."""
    params = dict(copy.named_parameters())
    with torch.no_grad():
        for name, t in sync_tensors(model):
            params[name].copy_(t)


def _generate_dynamic(model: PreTrainedModel, input_ids: Tensor, attn: Tensor,
                      positions: Tensor, n: int, max_new_tokens: int, temperature: float,
                      truncation: tuple[int, float, float], seed: int | None,
                      seeds: list[int] | None, eos: int | None, pad: int,
                      stop_t: tuple[str, ...], stop_mask: Tensor | None,
                      tok: PreTrainedTokenizerFast
                      ) -> list[tuple[list[int], list[float], bool]]:
    """The dynamic-cache loop: (tokens, log-probs, finished) per sample row."""
    device = input_ids.device
    b = input_ids.shape[0] * n
    gen: Any
    if seeds is not None:
        gen = [torch.Generator(device=device).manual_seed(x) for x in seeds]
    else:
        gen = torch.Generator(device=device)
        gen.manual_seed(seed if seed is not None else random.getrandbits(63))
    stop_mask = stop_mask.to(device) if stop_mask is not None else None
    tokens = torch.full((b, max_new_tokens), pad, dtype=torch.long, device=device)
    logps = torch.zeros((b, max_new_tokens), dtype=torch.float32, device=device)
    lengths = [max_new_tokens] * b
    finished = [False] * b
    cache_kw = cache_kwarg(model)
    # Prefill each distinct prompt once, then copy its cache to its n sample rows; only the
    # last position's logits are needed (not [P, Lp, V]).
    cache, logits = prefill(model, input_ids, attn, positions)
    compact = hasattr(cache, "batch_select_indices")
    if n > 1:
        if hasattr(cache, "batch_repeat_interleave"):
            cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)
            attn = attn.repeat_interleave(n, dim=0)
            positions = positions.repeat_interleave(n, dim=0)
        else:  # a cache type that cannot be copied: prefill every row
            input_ids, attn, positions = (x.repeat_interleave(n, dim=0)
                                          for x in (input_ids, attn, positions))
            cache, logits = prefill(model, input_ids, attn, positions)
    # `rows[j]` is the sample row that batch row j is generating; finished rows are dropped
    # from the batch (and its cache) so late steps only run live rows.
    rows = torch.arange(b, device=device)
    alive = torch.ones(b, dtype=torch.bool, device=device)
    next_pos = positions[:, -1]
    for t in range(max_new_tokens):
        nxt, lp = _sample(logits.float(), temperature, truncation, gen, rows // n)
        live = alive.nonzero().flatten()
        tokens[rows[live], t], logps[rows[live], t] = nxt[live], lp[live]
        fin = torch.zeros_like(alive)
        if eos is not None:
            fin |= (nxt == eos) & alive
        if stop_mask is not None:
            cand = (stop_mask[nxt] & alive & ~fin).nonzero().flatten().tolist()
            for j in cand:
                text = tok.decode(tokens[rows[j], : t + 1].tolist(), skip_special_tokens=True)
                if any(st in text for st in stop_t):
                    fin[j] = True
        for j in fin.nonzero().flatten().tolist():
            lengths[int(rows[j])], finished[int(rows[j])] = t + 1, True
        alive &= ~fin
        if not bool(alive.any()) or t == max_new_tokens - 1:
            break
        if compact and bool(fin.any()):
            keep = alive.nonzero().flatten()
            cache.batch_select_indices(keep)
            rows, nxt, attn, next_pos = rows[keep], nxt[keep], attn[keep], next_pos[keep]
            alive = alive[keep]
        # Without compaction, finished rows keep running masked out (pad input).
        nxt = torch.where(alive, nxt, torch.full_like(nxt, pad))
        attn = torch.cat([attn, alive.long()[:, None]], dim=1)
        next_pos = next_pos + 1
        out = model(input_ids=nxt[:, None], attention_mask=attn,
                    position_ids=next_pos[:, None], use_cache=True, **{cache_kw: cache})
        cache, logits = cache_of(out), out.logits[:, -1, :]
    tokens_l, logps_l = tokens.cpu().tolist(), logps.cpu().tolist()
    return [(tokens_l[i][: lengths[i]], logps_l[i][: lengths[i]], finished[i])
            for i in range(b)]


def _sample(logits: Tensor, temperature: float, truncation: tuple[int, float, float],
            gen: torch.Generator | list[torch.Generator], owner: Tensor | None = None
            ) -> tuple[Tensor, Tensor]:
    """`sampling.draw` with the uniforms from `gen`: one generator, or a list of them indexed
    by `owner[row]` (the row's prompt)."""
    if temperature <= 0:
        return draw(logits, temperature, truncation, None)
    if isinstance(gen, list):
        assert owner is not None
        u = torch.empty(logits.shape[0], dtype=torch.float64, device=logits.device)
        for p in owner.unique().tolist():
            idx = (owner == p).nonzero().flatten()
            u[idx] = torch.rand(len(idx), dtype=torch.float64, generator=gen[p],
                                device=logits.device)
    else:
        u = torch.rand(logits.shape[0], dtype=torch.float64, generator=gen,
                       device=logits.device)
    return draw(logits, temperature, truncation, u)
