"""Rollout engines: sample G completions per prompt with behaviour log-probs and offsets.

One small interface (`RolloutEngine`) with two engines:

- `HFEngine` — a batched, KV-cached sampling loop over any `transformers` causal LM (CPU or
  GPU). Written by hand rather than through `model.generate` because it needs exactly three
  things `generate` does not give cheaply: the log-prob of each sampled token under the
  temperature-scaled distribution, character offsets of each completion token, and stop-string
  checks that do not decode every row at every step.
- `SGLangEngine` — `sglang.Engine` (GPU), imported only when selected.
- `VLLMEngine` (engines/vllm.py) — `vllm.LLM` in the trainer's process (CPU or GPU), imported
  only when selected.

Conventions shared by both engines:

- The prompt and the completion are tokenized separately: the prompt is encoded on its own
  (with the tokenizer's default special tokens) and the completion is whatever tokens were
  sampled after it, so a BPE merge never crosses the prompt/completion boundary (`=`).
- `Sample.logprobs[t]` is `log_softmax(logits_t / T)[token_t]`: the temperature-scaled
  distribution *before* top-k / top-p / min-p truncation. With none of them (the default) this
  is exactly the sampling distribution; it is also what a trainer computes from a teacher-forced
  forward pass at the same temperature, so the two agree to float precision (with truncation,
  docs/algorithms.md says what the ratio and PRP's weights then miss). `temperature=0` means greedy
  decoding, with log-probs of the untempered (T=1) distribution.
- `Sample.text` is the decoded completion without special tokens and *includes* the stop
  string that ended it (the tokens that produced it were sampled and are trained on); if the
  token that completed a stop string carries more characters, they are kept too.
- `finish_reason` is "stop" when a stop string or the EOS token ended the completion, and
  "length" when the token budget ran out first (verifiers never credit "length").
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

ENGINES: tuple[str, ...] = ("hf", "sglang", "vllm")


@dataclass
class Sample:
    """One sampled completion of one prompt."""

    prompt_index: int
    """Index of the prompt in the `generate` call's list."""
    token_ids: list[int]
    """Completion tokens only (no prompt), including a final EOS when one was sampled."""
    text: str
    """Decoded completion (special tokens skipped), stop string included."""
    offsets: list[tuple[int, int]]
    """(start, end) character span in `text` of each completion token; zero-width for
    special tokens and for bytes that only complete a character in a later token."""
    logprobs: list[float]
    """Behaviour log-prob of each token: log_softmax(logits / T) before top-k / top-p / min-p
    truncation."""
    finish_reason: str
    """"stop" (stop string or EOS) or "length" (token budget exhausted)."""
    prompt_token_ids: list[int] = field(default_factory=list)
    """The prompt as the engine tokenized it (what a trainer must condition on)."""


class RolloutEngine(Protocol):
    """What the training loop needs from a sampler."""

    def generate(self, prompts: Sequence[str | Sequence[int]], n: int, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0, stop: list[str] | None = None,
                 seed: int | None = None, seeds: list[int] | None = None, top_k: int = 0,
                 min_p: float = 0.0) -> list[list[Sample]]:
        """`n` samples for each prompt: result[i] holds prompt i's samples, in order. A prompt
        is the policy's rendering as token ids (mutualrl.trainer.data.chat), or a text to tokenize.

        `top_k` (0: off), `top_p` (1: off) and `min_p` (0: off) truncate the
        temperature-scaled distribution, in that order, before each draw; the samples'
        `logprobs` stay those of the untruncated one. `seeds` (one per prompt) makes each
        prompt's samples depend on its own seed only, not on which other prompts share the call
        (data-parallel ranks split a round's prompts); it replaces `seed`."""
        ...

    def sync_weights(self, model: Any) -> None:
        """Make the engine sample from `model`'s current parameters (and hold its memory again
        after `release_memory`)."""
        ...

    def release_memory(self) -> None:
        """Free what the engine holds on the trainer's device until the next `sync_weights`
        (a no-op for an engine that shares the trainer's module)."""
        ...


def encode_prompt(tokenizer: Any, prompt: str | Sequence[int]) -> list[int]:
    """The prompt's token ids exactly as the engines encode them (trainers must match): a
    rendered prompt's ids (mutualrl.trainer.data.chat) as they are, a text through the tokenizer."""
    if not isinstance(prompt, str):
        return list(prompt)
    return list(tokenizer(prompt)["input_ids"])


def completion_offsets(tokenizer: Any, token_ids: list[int]) -> tuple[str, list[tuple[int, int]]]:
    """Decoded text of `token_ids` and each token's character span in it.

    Each token spans from the end of the previous prefix's decoding to the end of its own, so
    the spans tile the text in order. A prefix that ends inside a multi-byte character decodes
    to a replacement char; such a token gets a zero-width span and the character is credited to
    the token that completes it.
    """
    if not token_ids:
        return "", []
    backend = tokenizer.backend_tokenizer
    prefixes = backend.decode_batch([token_ids[: j + 1] for j in range(len(token_ids))],
                                    skip_special_tokens=True)
    text = prefixes[-1]
    offsets: list[tuple[int, int]] = []
    start = 0
    for p in prefixes:
        if not text.startswith(p):
            p = p.rstrip("\ufffd")
            end = len(p) if text.startswith(p) else start
        else:
            end = len(p)
        end = max(start, min(end, len(text)))
        offsets.append((start, end))
        start = end
    return text, offsets


class HFEngine:
    """Batched sampling with a KV cache over a `transformers` causal LM.

    The engine holds a reference to the live model, so after an optimizer step it already
    samples from the new weights; `sync_weights` only swaps which model object it uses.
    """

    def __init__(self, model: Any, tokenizer: Any) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise TypeError("HFEngine needs a fast tokenizer (character offsets)")
        self.model = model
        self.tokenizer = tokenizer
        self._stop_cache: dict[tuple[str, ...], Any] = {}

    def sync_weights(self, model: Any) -> None:
        """Sample from `model` from now on (no copy: it is the trainer's own module)."""
        self.model = model

    def release_memory(self) -> None:
        """Nothing to free: the KV cache lives only inside `generate`."""

    def _stop_candidates(self, stop: tuple[str, ...]) -> Any:
        """Bool mask over the vocabulary: tokens after which a stop string can be complete.

        A stop string ends in some character; only a token whose decoding contains that
        character (or an incomplete byte sequence) can complete it, so only rows that just
        sampled such a token need decoding. Cached per stop set.
        """
        import torch

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
        import torch

        if n < 1 or max_new_tokens < 1:
            raise ValueError("n and max_new_tokens must be >= 1")
        check_truncation(top_p, top_k, min_p)
        if not prompts:
            return []
        model, tok = self.model, self.tokenizer
        device = next(model.parameters()).device
        stop_t = tuple(s for s in (stop or []) if s)
        eos = tok.eos_token_id
        pad = tok.pad_token_id if tok.pad_token_id is not None else (eos or 0)

        prompt_ids = [encode_prompt(tok, p) for p in prompts]
        b = len(prompts) * n
        width = max(len(r) for r in prompt_ids)
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attn = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, r in enumerate(prompt_ids):  # left padding keeps every row's last token at -1
            input_ids[i, width - len(r):] = torch.tensor(r)
            attn[i, width - len(r):] = 1
        input_ids, attn = input_ids.to(device), attn.to(device)
        positions = (attn.cumsum(-1) - 1).clamp(min=0)

        gen: Any
        if seeds is not None:
            if len(seeds) != len(prompts):
                raise ValueError("seeds: one per prompt")
            gen = [torch.Generator(device=device).manual_seed(x) for x in seeds]
        else:
            gen = torch.Generator(device=device)
            gen.manual_seed(seed if seed is not None else random.getrandbits(63))
        stop_mask = self._stop_candidates(stop_t).to(device) if stop_t else None

        tokens = torch.full((b, max_new_tokens), pad, dtype=torch.long, device=device)
        logps = torch.zeros((b, max_new_tokens), dtype=torch.float32, device=device)
        lengths = [max_new_tokens] * b
        reason = ["length"] * b
        cache_kw = _cache_kwarg(model)

        was_training = model.training
        model.eval()
        try:
            with torch.inference_mode():
                # Prefill each distinct prompt once, then copy its cache to its n sample rows;
                # only the last position's logits are needed (not [P, Lp, V]).
                last_only = _last_logits_kwarg(model)
                out = model(input_ids=input_ids, attention_mask=attn, position_ids=positions,
                            use_cache=True, **last_only)
                cache, logits = _cache_of(out), out.logits[:, -1, :]
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
                        out = model(input_ids=input_ids, attention_mask=attn,
                                    position_ids=positions, use_cache=True, **last_only)
                        cache, logits = _cache_of(out), out.logits[:, -1, :]
                # `rows[j]` is the sample row that batch row j is generating; finished rows are
                # dropped from the batch (and its cache) so late steps only run live rows.
                rows = torch.arange(b, device=device)
                alive = torch.ones(b, dtype=torch.bool, device=device)
                next_pos = positions[:, -1]
                for t in range(max_new_tokens):
                    nxt, lp = _sample(logits.float(), temperature, (top_k, top_p, min_p), gen,
                                      rows // n)
                    live = alive.nonzero().flatten()
                    tokens[rows[live], t], logps[rows[live], t] = nxt[live], lp[live]
                    fin = torch.zeros_like(alive)
                    if eos is not None:
                        fin |= (nxt == eos) & alive
                    if stop_mask is not None:
                        cand = (stop_mask[nxt] & alive & ~fin).nonzero().flatten().tolist()
                        for j in cand:
                            text = tok.decode(tokens[rows[j], : t + 1].tolist(),
                                              skip_special_tokens=True)
                            if any(st in text for st in stop_t):
                                fin[j] = True
                    for j in fin.nonzero().flatten().tolist():
                        lengths[int(rows[j])], reason[int(rows[j])] = t + 1, "stop"
                    alive &= ~fin
                    if not bool(alive.any()) or t == max_new_tokens - 1:
                        break
                    if compact and bool(fin.any()):
                        keep = alive.nonzero().flatten()
                        cache.batch_select_indices(keep)
                        rows, nxt, attn, next_pos = rows[keep], nxt[keep], attn[keep], \
                            next_pos[keep]
                        alive = alive[keep]
                    # Without compaction, finished rows keep running masked out (pad input).
                    nxt = torch.where(alive, nxt, torch.full_like(nxt, pad))
                    attn = torch.cat([attn, alive.long()[:, None]], dim=1)
                    next_pos = next_pos + 1
                    out = model(input_ids=nxt[:, None], attention_mask=attn,
                                position_ids=next_pos[:, None], use_cache=True,
                                **{cache_kw: cache})
                    cache, logits = _cache_of(out), out.logits[:, -1, :]
        finally:
            model.train(was_training)

        tokens_l, logps_l = tokens.cpu().tolist(), logps.cpu().tolist()
        result: list[list[Sample]] = [[] for _ in prompts]
        for i in range(b):
            k = lengths[i]
            ids = tokens_l[i][:k]
            text, offsets = completion_offsets(tok, ids)
            result[i // n].append(Sample(prompt_index=i // n, token_ids=ids, text=text,
                                         offsets=offsets, logprobs=logps_l[i][:k],
                                         finish_reason=reason[i],
                                         prompt_token_ids=prompt_ids[i // n]))
        return result


def _cache_kwarg(model: Any) -> str:
    """transformers 5 renamed `past_key_values` to `cache`; accept either version."""
    import inspect

    # A peft model's forward passes **kwargs through: the wrapped model's name counts.
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"


def _last_logits_kwarg(model: Any) -> dict[str, int]:
    """`logits_to_keep=1` where the model's forward takes it (transformers causal LMs)."""
    import inspect

    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = inspect.signature(inner.forward).parameters
    return {"logits_to_keep": 1} if "logits_to_keep" in params else {}


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def check_truncation(top_p: float, top_k: int, min_p: float) -> None:
    """ValueError naming the first sampling truncation knob out of range."""
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0: off), got {top_k}")
    if not 0 <= min_p <= 1:
        raise ValueError(f"min_p must be in [0, 1] (0: off), got {min_p}")


def _sample(logits: Any, temperature: float, truncation: tuple[int, float, float], gen: Any,
            owner: Any = None) -> tuple[Any, Any]:
    """(token, log-prob under log_softmax(logits / T)) per row; T == 0 is greedy.
    `truncation` is (top_k, top_p, min_p); `gen` is one generator, or a list of them indexed
    by `owner[row]` (the row's prompt)."""
    import torch

    if temperature <= 0:
        logp = torch.log_softmax(logits, dim=-1)
        tok = logp.argmax(dim=-1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
    logp = torch.log_softmax(logits / temperature if temperature != 1.0 else logits, dim=-1)
    probs = _truncate(logp.exp(), *truncation)
    # Inverse-CDF draw: one uniform per row against the row's cumulative distribution.
    # torch.multinomial draws one exponential per vocabulary entry (151,936 logs per row and
    # token on a Qwen-size vocabulary), which made sampling most of a CPU rollout's time.
    if isinstance(gen, list):
        u = torch.empty(probs.shape[0], dtype=torch.float64, device=probs.device)
        for p in owner.unique().tolist():
            idx = (owner == p).nonzero().flatten()
            u[idx] = torch.rand(len(idx), dtype=torch.float64, generator=gen[p],
                                device=probs.device)
    else:
        u = torch.rand(probs.shape[0], dtype=torch.float64, generator=gen, device=probs.device)
    tok = _inverse_cdf(probs, u)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def _truncate(probs: Any, top_k: int, top_p: float, min_p: float) -> Any:
    """`probs` with the entries top_k, then top_p, then min_p leave out set to 0 (not
    renormalised: the draw scales by the row's total). Ties with the k-th entry stay."""
    import torch

    if 0 < top_k < probs.shape[-1]:
        kth = probs.topk(top_k, dim=-1).values[:, -1:]
        probs = probs * (probs >= kth)
    if top_p < 1.0:
        # Nucleus: keep the smallest prefix of the sorted distribution with mass >= top_p
        # of what top_k left.
        sp, idx = probs.sort(dim=-1, descending=True)
        mass = top_p if top_k == 0 else top_p * sp.sum(-1, keepdim=True)
        sp = sp * ((sp.cumsum(-1) - sp) < mass)
        probs = torch.zeros_like(probs).scatter(-1, idx, sp)
    if min_p > 0.0:
        probs = probs * (probs >= min_p * probs.max(dim=-1, keepdim=True).values)
    return probs


def _inverse_cdf(probs: Any, u: Any, block: int = 1024) -> Any:
    """[R] index of the first entry whose cumulative mass (float64) exceeds `u` times the row's
    total, so an entry of probability 0 is never drawn: its cumulative mass equals its
    predecessor's. Two levels, so the cumulative sum never runs over the whole vocabulary (one
    float64 cumsum over 151,936 entries cost more than the rest of a sampling step): the
    block of `block` entries is drawn from the blocks' sums, then the entry within it. Should
    rounding put the draw past the row's (or the block's) last entry of mass, the row's last
    entry of non-zero probability takes it."""
    import torch

    rows, v = probs.shape
    full = v // block * block
    # A block's sum in the probabilities' own dtype is accurate enough (pairwise summation of
    # 1,024 entries) and spares a float64 copy of the whole row.
    sums = [probs[:, :full].reshape(rows, full // block, block).sum(-1)]
    if full < v:
        sums.append(probs[:, full:].sum(-1, keepdim=True))
    block_cdf = torch.cat(sums, dim=-1).cumsum(-1, dtype=torch.float64)
    target = u * block_cdf[:, -1]
    b = torch.searchsorted(block_cdf, target[:, None], right=True).squeeze(-1)
    b = b.clamp(max=block_cdf.shape[-1] - 1)
    before = torch.where(b > 0, block_cdf.gather(-1, (b - 1).clamp(min=0)[:, None]).squeeze(-1),
                         torch.zeros_like(target))
    cols = b[:, None] * block + torch.arange(block, device=probs.device)
    inside = probs.gather(-1, cols.clamp(max=v - 1)) * (cols < v)
    j = torch.searchsorted(inside.cumsum(-1, dtype=torch.float64), (target - before)[:, None],
                           right=True).squeeze(-1)
    tok = (b * block + j).clamp(max=v - 1)
    bad = probs.gather(-1, tok[:, None]).squeeze(-1) <= 0
    if bool(bad.any()):
        tok[bad] = v - 1 - (probs[bad].flip(-1) > 0).to(torch.uint8).argmax(-1)
    return tok


def sync_tensors(model: Any) -> list[tuple[str, Any]]:
    """(name, tensor) of what an engine serving the base model's architecture must load."""
    from mutualrl.trainer.model.lora import is_lora, merged_named_tensors

    if is_lora(model):
        return merged_named_tensors(model)
    return [(name, p.detach()) for name, p in model.named_parameters()]


class SGLangEngine:
    """Rollouts through `sglang.Engine` (GPU). sglang is imported here, only when selected.

    The model directory is handed to SGLang once; afterwards `sync_weights` pushes the trainer's
    current parameters with `update_weights_from_tensor`. Prompts are passed as token ids
    encoded by our tokenizer so both sides agree on the prompt tokens. Log-probs are the
    engine's `output_token_logprobs`; SGLang computes them from the sampling-processed
    distribution unless configured otherwise (with top_k / top_p / min_p on, possibly the
    truncated one, unlike the HF engine's), so check `ratio_to_behaviour` runs against an HF
    teacher-forced pass before trusting them.
    """

    def __init__(self, model_path: str, tokenizer: Any, mem_fraction_static: float = 0.5,
                 release_memory: bool = True, **engine_kwargs: Any) -> None:
        try:
            import sglang
        except ImportError as e:
            raise ImportError(
                "rollout_engine 'sglang' needs the sglang package (a CUDA machine): "
                "pip install 'mutualrl-trainer[sglang]', or use rollout_engine: hf"
            ) from e
        self.tokenizer = tokenizer
        self.releases = release_memory
        self.released = False
        engine_kwargs.setdefault("skip_tokenizer_init", False)
        # The memory saver is what lets release/resume_memory_occupation free and restore the
        # weights and KV cache at the same addresses (CUDA graphs stay valid).
        self.engine = sglang.Engine(model_path=str(model_path),
                                    mem_fraction_static=mem_fraction_static,
                                    enable_memory_saver=release_memory, **engine_kwargs)

    def release_memory(self) -> None:
        """Free SGLang's weights and KV cache on the GPU while the trainer steps."""
        if self.releases and not self.released:
            # Exactly the two regions the sync resumes (newer SGLang has more tags, e.g. CUDA
            # graphs, which then stay resident).
            self.engine.release_memory_occupation(tags=["weights", "kv_cache"])
            self.released = True

    def sync_weights(self, model: Any) -> None:
        """Push every parameter of `model` into the running engine (and flush its KV cache);
        a LoRA policy's adapters are merged into the base weights first. A released engine
        gets its weights' memory back first and its KV cache only after the copy, so the two
        never coexist with the tensors being sent."""
        if self.released:
            self.engine.resume_memory_occupation(tags=["weights"])
        self.engine.update_weights_from_tensor(named_tensors=sync_tensors(model),
                                               flush_cache=True)
        if self.released:
            self.engine.resume_memory_occupation(tags=["kv_cache"])
            self.released = False

    def served_weights(self, names: list[str], rows: int = 100) -> dict[str, Any]:
        """The first `rows` rows of the engine's parameters `names` (under the HF names; a
        test compares them with the trainer's after a sync)."""
        return {n: self.engine.get_weights_by_name(n, truncate_size=rows) for n in names}

    def generate(self, prompts: Sequence[str | Sequence[int]], n: int, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0, stop: list[str] | None = None,
                 seed: int | None = None, seeds: list[int] | None = None, top_k: int = 0,
                 min_p: float = 0.0) -> list[list[Sample]]:
        """`n` samples per prompt via one batched `Engine.generate` call."""
        tok = self.tokenizer
        prompt_ids = [encode_prompt(tok, p) for p in prompts]
        params = sglang_sampling_params(max_new_tokens, temperature, top_p, top_k, min_p, stop)
        if seed is not None:
            params["sampling_seed"] = seed
        per_prompt = [params if seeds is None else {**params, "sampling_seed": seeds[i]}
                      for i in range(len(prompts))]
        batch = [ids for ids in prompt_ids for _ in range(n)]
        outs = self.engine.generate(input_ids=batch,
                                    sampling_params=[per_prompt[i // n] for i in range(len(batch))],
                                    return_logprob=True)
        result: list[list[Sample]] = [[] for _ in prompts]
        for i, o in enumerate(outs):
            meta = o["meta_info"]
            lps = meta["output_token_logprobs"]  # [(logprob, token_id, text|None), ...]
            ids = [int(x[1]) for x in lps]
            text, offsets = completion_offsets(tok, ids)
            fr = meta.get("finish_reason") or {}
            reason = "length" if (fr.get("type") if isinstance(fr, dict) else fr) == "length" \
                else "stop"
            result[i // n].append(Sample(prompt_index=i // n, token_ids=ids, text=text,
                                         offsets=offsets, logprobs=[float(x[0]) for x in lps],
                                         finish_reason=reason, prompt_token_ids=batch[i]))
        return result


def sglang_sampling_params(max_new_tokens: int, temperature: float, top_p: float, top_k: int,
                           min_p: float, stop: list[str] | None) -> dict[str, Any]:
    """SGLang's `sampling_params` for one call (its top_k -1 is off, ours 0); the knobs are
    checked here, so a bad one fails before the engine sees it."""
    check_truncation(top_p, top_k, min_p)
    return {"max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p,
            "top_k": top_k if top_k > 0 else -1, "min_p": min_p, "stop": list(stop or []),
            "no_stop_trim": True, "skip_special_tokens": True}


def make_engine(name: str, model: Any, tokenizer: Any, model_path: str | None = None,
                **kwargs: Any) -> RolloutEngine:
    """Engine `name` ("hf", "sglang" or "vllm") over `model`; sglang and vllm also need the
    model directory (they load it once, then take weight syncs)."""
    if name == "hf":
        return HFEngine(model, tokenizer)
    path = model_path or getattr(getattr(model, "config", None), "_name_or_path", None)
    if name in ("sglang", "vllm") and not path:
        raise ValueError(f"the {name} engine needs model_path (a saved model directory)")
    if name == "sglang":
        return SGLangEngine(str(path), tokenizer, **kwargs)
    if name == "vllm":
        from mutualrl.trainer.engines.vllm import VLLMEngine

        return VLLMEngine(str(path), tokenizer, **kwargs)
    raise ValueError(f"unknown rollout engine {name!r}; expected one of {ENGINES}")
