"""PRP: peer rollout pooling with importance weights (docs/design.md (9)).

Peer rollouts join the receiver's group; advantages are recomputed over own + peer rewards; each
peer sample (or THL chunk) is weighted by w = pi_i(y) / pi_j_old(y). Weight modes:
``drop`` (HACPO: clip to [1-delta, 1], drop below 1-delta), ``truncate`` (min(w, c)) and
``none`` (w = 1, biased but keeps the peer's support).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import Tensor

from mutualrl.trainer.algos.loss import EPS, group_advantages
from mutualrl.trainer.algos.modes import ScaleRewards

WeightMode = Literal["drop", "truncate", "none"]


def sequence_log_weight(
    recv_logp: Tensor, recv_mask: Tensor, send_logp: Tensor, send_mask: Tensor
) -> Tensor:
    """Length-normalised log ratio per sequence: (log pi_i(y) - log pi_j(y)) / |y|_i
    (docs/design.md (9), sequence level).

    Both sums are over the same text in each side's own tokens, so their difference is the
    true sequence log ratio; dividing by the receiver's token count gives a per-token
    (geometric-mean) ratio that does not explode with length. Shapes ``[B, T_i]``, ``[B, T_j]``.
    """
    rm = recv_mask.to(recv_logp.dtype)
    sm = send_mask.to(send_logp.dtype)
    recv = (recv_logp * rm).sum(dim=-1)
    send = (send_logp * sm).sum(dim=-1)
    return (recv - send) / rm.sum(dim=-1).clamp(min=1.0)


def chunk_log_weight(recv_chunk_logp: Tensor, send_chunk_logp: Tensor) -> Tensor:
    """Per-chunk log ratio: a chunk's log-prob is the sum of its tokens' (THL conserves mass,
    docs/design.md (10)); docs/design.md (9), chunk level."""
    return recv_chunk_logp - send_chunk_logp


def chunk_to_tokens(chunk_values: Tensor, token_chunk: Tensor) -> Tensor:
    """Spread ``[B, C]`` chunk values onto ``[B, T]`` receiver tokens given each token's chunk
    index (``-1`` for padding, which gets 0)."""
    idx = token_chunk.clamp(min=0)
    out = torch.gather(chunk_values, -1, idx)
    return torch.where(token_chunk >= 0, out, torch.zeros_like(out))


@dataclass
class Weights:
    """Importance weights after the weight mode, with what the mode did."""

    weights: Tensor
    """Weight to multiply into the policy-gradient term (0 where dropped)."""
    kept: Tensor
    """Bool: the sample / chunk takes part in the loss."""
    clipped: Tensor
    """Bool: the raw weight was changed by the mode (clamped or truncated), among kept ones."""
    raw: Tensor
    """w = exp(log w) before the mode."""


def apply_weight_mode(
    log_w: Tensor, mode: WeightMode, delta: float = 0.2, cap: float = 1.0
) -> Weights:
    """Turn log importance ratios into loss weights according to ``mode`` (docs/design.md (9):
    drop, truncate, none)."""
    raw = torch.exp(log_w)
    if mode == "drop":
        kept = raw >= 1.0 - delta
        clamped = raw.clamp(1.0 - delta, 1.0)
        weights = torch.where(kept, clamped, torch.zeros_like(raw))
        clipped = kept & (raw > 1.0)
    elif mode == "truncate":
        kept = torch.ones_like(raw, dtype=torch.bool)
        weights = raw.clamp(max=cap)
        clipped = raw > cap
    elif mode == "none":
        kept = torch.ones_like(raw, dtype=torch.bool)
        weights = torch.ones_like(raw)
        clipped = torch.zeros_like(raw, dtype=torch.bool)
    else:
        raise ValueError(f"unknown weight mode {mode!r}")
    return Weights(weights=weights, kept=kept, clipped=clipped, raw=raw)


def weight_stats(w: Weights, valid: Tensor | None = None) -> dict[str, float]:
    """Mean / variance of the raw weights, mean log weight, kept and clipped shares
    (over ``valid`` entries, e.g. real chunks). Zeros when there is nothing to weigh."""
    valid = torch.ones_like(w.raw, dtype=torch.bool) if valid is None else valid.bool()
    raw = w.raw[valid].double()
    if raw.numel() == 0:
        return {"mean": 0.0, "var": 0.0, "mean_log": 0.0, "kept": 0.0, "clipped": 0.0, "n": 0}
    return {
        "mean": float(raw.mean()),
        "var": float(raw.var(correction=0)),
        "mean_log": float(torch.log(raw).mean()),
        "kept": float(w.kept[valid].double().mean()),
        "clipped": float(w.clipped[valid].double().mean()),
        "n": int(raw.numel()),
    }


HIST_LO, HIST_HI = -12, 6
"""Edges (nats) of `log_weight_histogram`: unit bins [e, e+1) for e in HIST_LO..HIST_HI-1."""


def log_weight_histogram(w: Weights, valid: Tensor | None = None) -> dict[int, int]:
    """Counts of the raw log importance weights (nats) in unit bins, keyed by each bin's lower
    edge; the outer bins also hold everything below HIST_LO / above HIST_HI. Empty bins are
    left out. Over ``valid`` entries (e.g. real chunks), like `weight_stats`."""
    valid = torch.ones_like(w.raw, dtype=torch.bool) if valid is None else valid.bool()
    log_w = torch.log(w.raw[valid].double())
    if log_w.numel() == 0:
        return {}
    # -inf (a weight that underflowed to 0) lands in the lowest bin, +inf in the highest.
    edges = torch.floor(torch.nan_to_num(log_w, nan=float(HIST_LO), neginf=float(HIST_LO),
                                         posinf=float(HIST_HI - 1)))
    edges = edges.clamp(HIST_LO, HIST_HI - 1).long()
    values, counts = torch.unique(edges, return_counts=True)
    return {int(v): int(c) for v, c in zip(values, counts, strict=True)}


def pooled_advantages(
    own: Tensor, peers: Sequence[Tensor], eps: float = EPS, scale: ScaleRewards = "group"
) -> tuple[Tensor, list[Tensor]]:
    """Advantages over own ``[P, G]`` + each prompt's peer rewards (``peers[p]``: ``[M_p]``),
    scaled as `scale` says (`batch`: by the std of the round's own rewards).

    Prompts without peer rewards keep exactly GRPO's values (same batched call), so PRP with no
    peer data is GRPO. Returns (own advantages ``[P, G]``, peer advantages per prompt).
    """
    if len(peers) != own.shape[0]:
        raise ValueError(f"peers has {len(peers)} rows, own rewards {own.shape[0]}")
    own_adv = group_advantages(own, eps, scale)
    peer_adv: list[Tensor] = []
    for i, peer in enumerate(peers):
        if peer.numel() == 0:
            peer_adv.append(peer.new_zeros(0))
            continue
        union = group_advantages(torch.cat([own[i], peer.to(own.dtype)]), eps, scale, own)
        own_adv[i] = union[: own.shape[1]]
        peer_adv.append(union[own.shape[1] :])
    return own_adv, peer_adv


class PeerLogps(Protocol):
    """What the weights need of the peer rows (`probes.PeerRows` has it)."""

    sender_logp_sum: Tensor
    """[M] sender's sequence log-prob (sequence level)."""
    token_chunk: list[list[int]] | None
    """Chunk level: chunk index of each receiver token."""
    chunk_sender_logp: list[list[float]] | None
    """Chunk level: sender log-prob of each chunk."""


class WeightSettings(Protocol):
    """The weight knobs (`config.ProbeSettings` has them)."""

    prp_level: Literal["sequence", "chunk"]
    prp_weight_mode: WeightMode
    prp_delta: float
    prp_cap: float


def receiver_chunk_logp(logp: Tensor, token_chunk: Tensor, n_chunks: int) -> Tensor:
    """[M, C] sum of receiver token log-probs per chunk (padding chunk index -1 adds nothing)."""
    idx = token_chunk.clamp(min=0)
    vals = torch.where(token_chunk >= 0, logp, torch.zeros_like(logp))
    return logp.new_zeros(logp.shape[0], n_chunks).scatter_add(-1, idx, vals)


def chunk_tables(token_chunk: list[list[int]], chunk_sender_logp: list[list[float]],
                 like: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Padded tables of the peer rows' chunks for receiver log-probs ``like`` (``[M, T]``):
    each token's chunk index ``[M, T]`` (-1 on padding), the sender's log-prob of each chunk
    ``[M, C]`` and which chunks are real ``[M, C]``."""
    m_rows, t = like.shape
    n_chunks = max(max((len(c) for c in chunk_sender_logp), default=1), 1)
    index = torch.full((m_rows, t), -1, dtype=torch.long, device=like.device)
    send = like.new_zeros(m_rows, n_chunks)
    valid = torch.zeros(m_rows, n_chunks, dtype=torch.bool, device=like.device)
    for i, (tc, sc) in enumerate(zip(token_chunk, chunk_sender_logp, strict=True)):
        index[i, : len(tc)] = torch.tensor(tc, dtype=torch.long)
        send[i, : len(sc)] = torch.tensor(sc, dtype=like.dtype)
        valid[i, : len(sc)] = True
    return index, send, valid


def peer_weights(logp: Tensor, mask: Tensor, peers: PeerLogps, s: WeightSettings
                 ) -> tuple[Tensor, Tensor, dict[str, float]]:
    """[M, T] importance weights and [M, T] mask of peer rows after the weight mode, with
    statistics and the log-weight histogram (`loghist/<edge>`); `logp` holds the receiver's
    pre-step log-probs of the peer tokens (detached here: the weights are constants of the
    step, as the estimator requires)."""
    lp = logp.detach()
    if s.prp_level == "sequence":
        send = peers.sender_logp_sum.to(lp).unsqueeze(-1)
        log_w = sequence_log_weight(lp, mask, send, torch.ones_like(send))
        w = apply_weight_mode(log_w, s.prp_weight_mode, s.prp_delta, s.prp_cap)
        stats = weight_stats(w)
        hist = log_weight_histogram(w)
        weights = w.weights.unsqueeze(-1).expand_as(lp)
        keep = w.kept.unsqueeze(-1).expand_as(mask)
    else:
        assert peers.token_chunk is not None and peers.chunk_sender_logp is not None
        token_chunk, send, chunk_valid = chunk_tables(peers.token_chunk,
                                                      peers.chunk_sender_logp, lp)
        recv = receiver_chunk_logp(lp, token_chunk, send.shape[1])
        w = apply_weight_mode(chunk_log_weight(recv, send), s.prp_weight_mode, s.prp_delta,
                              s.prp_cap)
        stats = weight_stats(w, chunk_valid)
        hist = log_weight_histogram(w, chunk_valid)
        weights = chunk_to_tokens(w.weights, token_chunk)
        keep = chunk_to_tokens(w.kept.to(lp.dtype), token_chunk) > 0
    stats.update({f"loghist/{edge}": float(n) for edge, n in hist.items()})
    return weights, mask * keep.to(mask.dtype), stats
