"""Packing prompts + completions into one padded batch and scoring completion tokens.

Layout: prompts left-padded to a common length Lp, completions right-padded to T, so every
completion starts at column Lp and the logits of columns [Lp-1, Lp+T-1) predict it. Position ids
count real tokens only, so left padding does not shift positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


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


def completion_logprobs(model: torch.nn.Module, batch: Batch, temperature: float = 1.0) -> Tensor:
    """``[B, T]`` log pi(y_t | x, y_<t) of the completion tokens, at sampling temperature
    (padding positions hold finite junk; multiply by the mask)."""
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    )
    t = batch.completion_ids.shape[1]
    logits = out.logits[:, batch.prompt_len - 1 : batch.prompt_len - 1 + t].float()
    if temperature != 1.0:
        logits = logits / temperature
    # gather - logsumexp: avoids materialising the full log_softmax over the vocabulary.
    picked = logits.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)
