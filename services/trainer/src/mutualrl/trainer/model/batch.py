"""Packing prompts + completions into one padded batch and scoring completion tokens.

Layout: prompts left-padded to a common length Lp, completions right-padded to T, so every
completion starts at column Lp and the logits of columns [Lp-1, Lp+T-1) predict it. Position ids
count real tokens only, so left padding does not shift positions.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint


@dataclass
class Batch:
    input_ids: Tensor
    """``[B, Lp + T]`` token ids (padding = pad id)."""
    attention_mask: Tensor
    """``[B, Lp + T]`` 1 on real tokens."""
    position_ids: Tensor
    """``[B, Lp + T]`` positions counted over real tokens."""
    completion_ids: Tensor
    """``[B, T]`` completion tokens."""
    completion_mask: Tensor
    """``[B, T]`` 1 on real completion tokens."""
    prompt_len: int
    """Lp: the column where every completion starts."""


def pack(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    pad_id: int,
    device: str | torch.device = "cpu",
) -> Batch:
    """One padded batch from token-id lists (row b = prompts[b] + completions[b])."""
    if len(prompts) != len(completions):
        raise ValueError("prompts and completions differ in length")
    b = len(prompts)
    lp = max((len(p) for p in prompts), default=0)
    t = max(max((len(c) for c in completions), default=0), 1)
    ids = torch.full((b, lp + t), pad_id, dtype=torch.long)
    attn = torch.zeros((b, lp + t), dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        ids[i, lp - len(p) : lp] = torch.tensor(list(p), dtype=torch.long)
        ids[i, lp : lp + len(c)] = torch.tensor(list(c), dtype=torch.long)
        attn[i, lp - len(p) : lp + len(c)] = 1
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return Batch(
        input_ids=ids.to(device),
        attention_mask=attn.to(device),
        position_ids=pos.to(device),
        completion_ids=ids[:, lp:].to(device),
        completion_mask=attn[:, lp:].to(device),
        prompt_len=lp,
    )


def completion_logprobs(
    model: torch.nn.Module, batch: Batch, temperature: float = 1.0,
    chunk_tokens: int | None = None,
) -> Tensor:
    """``[B, T]`` log pi(y_t | x, y_<t) of the completion tokens at sampling temperature
    (0 at padding positions).

    The body runs once; the LM head and the log-softmax then run over the real completion
    tokens in chunks of `chunk_tokens` positions, each recomputed in backward
    (torch.utils.checkpoint), so the logits held at any time are ``chunk_tokens x V``, never
    ``[B, T, V]``. None: one chunk (small models, tests). Models whose head is not a plain
    linear map of the body's last hidden state (logit soft-capping, a logit scale) fall back to
    the full logits.
    """
    return _completion_values(model, batch, temperature, chunk_tokens, entropy=False)[..., 0]


def completion_logprobs_and_entropy(
    model: torch.nn.Module, batch: Batch, temperature: float = 1.0,
    chunk_tokens: int | None = None,
) -> tuple[Tensor, Tensor]:
    """`completion_logprobs` and, from the same log-softmax, ``[B, T]`` the entropy of the
    temperature-scaled next-token distribution at each completion position (0 at padding)."""
    both = _completion_values(model, batch, temperature, chunk_tokens, entropy=True)
    return both[..., 0], both[..., 1]


def _completion_values(model: torch.nn.Module, batch: Batch, temperature: float,
                       chunk_tokens: int | None, entropy: bool) -> Tensor:
    """``[B, T, 1]`` log-probs, or ``[B, T, 2]`` log-probs and entropies (`entropy`)."""
    t = batch.completion_ids.shape[1]
    picked_ids = batch.completion_ids
    real = batch.completion_mask.bool()
    width = 2 if entropy else 1
    head = _plain_head(model)
    if head is None:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    position_ids=batch.position_ids, use_cache=False)
        logits = out.logits[:, batch.prompt_len - 1 : batch.prompt_len - 1 + t]
        return torch.where(real.unsqueeze(-1),
                           _token_values(logits, picked_ids, temperature, entropy),
                           logits.new_zeros(()).to(_wide(logits.dtype)))
    body, lm_head = head
    if _sharded(model):
        hidden = _hidden_through_root(model, body, batch)
    else:
        hidden = body(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                      position_ids=batch.position_ids, use_cache=False).last_hidden_state
    # Column j of the hidden states predicts token j + 1: completions start at prompt_len.
    h = hidden[:, batch.prompt_len - 1 : batch.prompt_len - 1 + t][real]
    ids = picked_ids[real]
    step = max(1, chunk_tokens or max(1, h.shape[0]))
    parts = []
    for i in range(0, h.shape[0], step):
        if torch.is_grad_enabled() and h.requires_grad:
            part = checkpoint(_chunk_values, h[i : i + step], ids[i : i + step], lm_head,
                              temperature, entropy, use_reentrant=False)
        else:
            part = _chunk_values(h[i : i + step], ids[i : i + step], lm_head, temperature,
                                 entropy)
        parts.append(part)
    dtype = parts[0].dtype if parts else _wide(hidden.dtype)
    out_values = hidden.new_zeros((*real.shape, width), dtype=dtype)
    if parts:
        out_values = out_values.masked_scatter(real.unsqueeze(-1), torch.cat(parts))
    return out_values


def _sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _hidden_through_root(model: torch.nn.Module, body: torch.nn.Module, batch: Batch) -> Tensor:
    """The body's last hidden states of a model sharded with FSDP2 (nproc > 1). Its root unit's
    parameters (embeddings, final norm, a tied head) are gathered only by the root's own
    forward, and stay gathered after it until backward, so the root runs (with logits for one
    position only) and the body's output is taken on the way; the chunked head then uses the
    gathered head weight."""
    captured: list[Tensor] = []
    handle = body.register_forward_hook(
        lambda _m, _a, out: captured.append(out.last_hidden_state))
    try:
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
              position_ids=batch.position_ids, use_cache=False, logits_to_keep=1)
    finally:
        handle.remove()
    return captured[0]


def _wide(dtype: torch.dtype) -> torch.dtype:
    """Log-softmax precision: at least float32 (bf16 logits), float64 stays float64."""
    return torch.promote_types(dtype, torch.float32)


def _token_values(logits: Tensor, ids: Tensor, temperature: float, entropy: bool) -> Tensor:
    """``[..., 1]`` log-probs of `ids`, or ``[..., 2]`` with the distribution's entropy."""
    logits = logits.to(_wide(logits.dtype))
    if temperature != 1.0:
        logits = logits / temperature
    # One fused log_softmax then a gather: about a third cheaper, forward and backward, than
    # gather - logsumexp on CPU (logsumexp takes several passes over the vocabulary, each with
    # its own temporary), and no more memory: logsumexp's exp(logits - max) is as large.
    logp = torch.log_softmax(logits, dim=-1)
    picked = logp.gather(-1, ids.unsqueeze(-1))
    if not entropy:
        return picked
    return torch.cat([picked, -(logp.exp() * logp).sum(-1, keepdim=True)], dim=-1)


def _chunk_values(h: Tensor, ids: Tensor, lm_head: torch.nn.Module, temperature: float,
                  entropy: bool) -> Tensor:
    return _token_values(lm_head(h), ids, temperature, entropy)


def _plain_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(body, LM head) of a transformers causal LM whose logits are head(last hidden state)."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "final_logit_softcapping", None) or getattr(
            cfg, "logit_scale", None) not in (None, 1.0):
        return None
    if _sharded(model) and "logits_to_keep" not in inspect.signature(model.forward).parameters:
        return None  # see _hidden_through_root
    get_head = getattr(model, "get_output_embeddings", None)
    get_body = getattr(model, "get_decoder", None)
    head = get_head() if callable(get_head) else None
    body = get_body() if callable(get_body) else None
    if not isinstance(head, torch.nn.Linear) or body is None or body is model:
        return None
    return body, head
