"""`HFEngine` — a batched, KV-cached sampling loop over any `transformers` causal LM (CPU or
GPU). Written by hand rather than through `model.generate` because it needs exactly three
things `generate` does not give cheaply: the log-prob of each sampled token under the
temperature-scaled distribution, character offsets of each completion token, and stop-string
checks that do not decode every row at every step. It keeps the conventions of
`engines.base` (the other engines: `engines.vllm`, `engines.sglang`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from mutualrl.trainer.engines.base import (
    Sample,
    check_truncation,
    completion_offsets,
    encode_prompt,
)


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


