"""F-TIS: filtered truncated importance sampling across heterogeneous generators (arXiv
2605.22537; docs/design.md (14)).

Peer completions come with the generator's per-token log-probs (SEE's ROLLOUT records carry
them, as for PRP). Each source's completions of a prompt form a group of their own (advantages
as `algos.sapo.per_source_advantages`); the clipped GRPO term of a peer token is weighted by the
truncated importance weight

    w_t = min(π_θ(y_t) / π_gen(y_t), C)

with π_θ the learner's pre-step policy (a constant of the step), and a peer sample with a
negative advantage is masked out when its KL estimate exceeds the gate g:

    KL̂ = Σ_t (r_t log r_t − r_t + 1),   r_t = π_θ(y_t) / π_gen(y_t)

(each term ≥ 0 and, for tokens drawn by the generator, an unbiased estimate of
KL(π_θ ‖ π_gen) at that position). Across tokenizers both run per THL chunk
(docs/design.md (10)): a chunk's log-prob is the sum of its tokens', so with one tokenizer the
chunks are the tokens and this is the paper's per-token form. Only torch is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from mutualrl.trainer.algos.prp import (
    chunk_log_weight,
    chunk_tables,
    chunk_to_tokens,
    receiver_chunk_logp,
)

KL_LOG_RATIO_BOUND = 50.0
"""|log r| is bounded here inside the KL estimate only (e^50 · 49 ≈ 2.5e23, past any gate), so
a huge ratio gives a huge finite KL, never inf − inf."""


class FtisSettings(Protocol):
    """F-TIS's knobs (`config.ProbeSettings` has them)."""

    ftis_cap: float
    ftis_kl_gate: float


class ChunkRows(Protocol):
    """What F-TIS reads of the peer rows (`probes.PeerRows` has it)."""

    advantages: Tensor
    """[M] the advantage of each peer row."""
    token_chunk: list[list[int]] | None
    """The THL chunk of each receiver token."""
    chunk_sender_logp: list[list[float]] | None
    """The generator's log-prob of each chunk."""


def truncated_weights(log_w: Tensor, cap: float) -> Tensor:
    """min(exp(log w), C)."""
    return torch.exp(log_w).clamp(max=cap)


def kl_terms(log_w: Tensor) -> Tensor:
    """r log r − r + 1 per entry, r = exp(log w) (log w bounded by KL_LOG_RATIO_BOUND)."""
    lw = log_w.clamp(-KL_LOG_RATIO_BOUND, KL_LOG_RATIO_BOUND)
    return torch.exp(lw) * (lw - 1.0) + 1.0


def filtered(advantages: Tensor, kl: Tensor, gate: float) -> Tensor:
    """Bool ``[M]``: rows left out, those with A < 0 and KL̂ > g."""
    return (advantages < 0) & (kl > gate)


@dataclass
class FtisRows:
    """F-TIS's peer rows before the first update."""

    weights: Tensor
    """[M, T] w_t on every receiver token (its chunk's)."""
    keep: Tensor
    """[M, T] the mask without the rows the KL gate filtered."""
    kl: Tensor
    """[M] KL̂ per row."""
    stats: dict[str, float]


def ftis_rows(logp_old: Tensor, mask: Tensor, rows: ChunkRows, s: FtisSettings) -> FtisRows:
    """Truncated weights, KL estimates and the gate of the peer rows from the learner's
    pre-step log-probs ``logp_old`` of their tokens; statistics `ftis_*` (the share of chunks
    truncated at C, the mean KL̂, the rows filtered)."""
    if rows.token_chunk is None or rows.chunk_sender_logp is None:
        raise ValueError("F-TIS needs the peer rows' THL chunks and the generator's log-probs")
    lp = logp_old.detach()
    m_rows = lp.shape[0]
    token_chunk, send, valid = chunk_tables(rows.token_chunk, rows.chunk_sender_logp, lp)
    log_w = chunk_log_weight(receiver_chunk_logp(lp, token_chunk, send.shape[1]), send)
    w = truncated_weights(log_w, s.ftis_cap)
    kl = (kl_terms(log_w) * valid.to(lp.dtype)).sum(-1)
    out = filtered(rows.advantages.to(lp.dtype), kl, s.ftis_kl_gate)
    keep = mask * (~out).to(mask.dtype).unsqueeze(-1)
    n = max(int(valid.sum()), 1)
    stats = {"ftis_truncated": float(((log_w.exp() > s.ftis_cap) & valid).sum()) / n,
             "ftis_kl": float(kl.mean()) if m_rows else 0.0,
             "ftis_filtered": float(out.sum())}
    return FtisRows(weights=chunk_to_tokens(w, token_chunk), keep=keep, kl=kl, stats=stats)
