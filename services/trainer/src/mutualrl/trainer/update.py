"""The round's loss (docs/design.md (8)): GRPO (3)-(5) over own (+ PRP peer) rows, weighted
by PRP's importance weights (9), plus SGT's rescue term (7).

`round_loss` is the definition, in one forward pass over every row: fine for tests and tiny
models, but it holds the logits of the whole batch. Training runs `step.optimise`, which takes
the same loss over micro-batches (and mini-batches, epochs) in bounded memory. In both, PRP's
importance weights use the receiver's pre-step log-probs of the peer tokens, detached, so they
are constants of the step as the estimator requires. Sequences are given as token-id lists;
prompts in the receiver's tokens are shared by own rows, peer rows and demonstrations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mutualrl.trainer.algos import prp as prp_math
from mutualrl.trainer.algos.grpo import grpo_loss, nonzero_variance_groups
from mutualrl.trainer.algos.sgt import sgt_loss
from mutualrl.trainer.batch import completion_logprobs, pack
from mutualrl.trainer.config import GRPOSettings, ProbeSettings
from mutualrl.trainer.probes.base import LossInputs, RoundData


@dataclass
class Loss:
    total: Tensor
    stats: dict[str, float]


def _receiver_chunk_logp(logp: Tensor, token_chunk: Tensor, n_chunks: int) -> Tensor:
    """[M, C] sum of receiver token log-probs per chunk (padding chunk index -1 adds nothing)."""
    idx = token_chunk.clamp(min=0)
    vals = torch.where(token_chunk >= 0, logp, torch.zeros_like(logp))
    return logp.new_zeros(logp.shape[0], n_chunks).scatter_add(-1, idx, vals)


def peer_weights(
    logp: Tensor, mask: Tensor, plan: LossInputs, probe: ProbeSettings
) -> tuple[Tensor, Tensor, dict[str, float]]:
    """[M, T] weights and [M, T] mask of peer rows after the weight mode, with statistics;
    `logp` holds the receiver's pre-step log-probs of the peer tokens."""
    peers = plan.peers
    assert peers is not None
    lp = logp.detach()
    if probe.prp_level == "sequence":
        send = peers.sender_logp_sum.to(lp).unsqueeze(-1)
        log_w = prp_math.sequence_log_weight(lp, mask, send, torch.ones_like(send))
        w = prp_math.apply_weight_mode(log_w, probe.prp_weight_mode, probe.prp_delta, probe.prp_cap)
        stats = prp_math.weight_stats(w)
        hist = prp_math.log_weight_histogram(w)
        weights = w.weights.unsqueeze(-1).expand_as(lp)
        keep = w.kept.unsqueeze(-1).expand_as(mask)
    else:
        assert peers.token_chunk is not None and peers.chunk_sender_logp is not None
        t = lp.shape[1]
        n_chunks = max(max((len(c) for c in peers.chunk_sender_logp), default=1), 1)
        token_chunk = torch.full((lp.shape[0], t), -1, dtype=torch.long, device=lp.device)
        send = lp.new_zeros(lp.shape[0], n_chunks)
        chunk_valid = torch.zeros(lp.shape[0], n_chunks, dtype=torch.bool, device=lp.device)
        for i, (tc, sc) in enumerate(zip(peers.token_chunk, peers.chunk_sender_logp, strict=True)):
            token_chunk[i, : len(tc)] = torch.tensor(tc, dtype=torch.long)
            send[i, : len(sc)] = torch.tensor(sc, dtype=torch.float64)
            chunk_valid[i, : len(sc)] = True
        recv = _receiver_chunk_logp(lp, token_chunk, n_chunks)
        w = prp_math.apply_weight_mode(
            prp_math.chunk_log_weight(recv, send), probe.prp_weight_mode, probe.prp_delta,
            probe.prp_cap)
        stats = prp_math.weight_stats(w, chunk_valid)
        hist = prp_math.log_weight_histogram(w, chunk_valid)
        weights = prp_math.chunk_to_tokens(w.weights, token_chunk)
        keep = prp_math.chunk_to_tokens(w.kept.to(lp.dtype), token_chunk) > 0
    stats.update({f"loghist/{edge}": float(n) for edge, n in hist.items()})
    return weights, mask * keep.to(mask.dtype), stats


def round_loss(
    model: torch.nn.Module,
    ref_model: torch.nn.Module | None,
    prompt_ids: Sequence[Sequence[int]],
    data: RoundData,
    plan: LossInputs,
    grpo: GRPOSettings,
    probe: ProbeSettings,
    pad_id: int,
    max_new_tokens: int,
) -> Loss:
    """Scalar loss of one round and its statistics (loss parts, KL, clip fraction, weights)."""
    device = next(model.parameters()).device
    p_n, g_n = data.rewards.shape
    own_prompts = [prompt_ids[p] for p in range(p_n) for _ in range(g_n)]
    own_completions = [s.token_ids for row in data.samples for s in row]
    peers = plan.peers
    prompts = own_prompts + ([prompt_ids[i] for i in peers.prompt_index] if peers else [])
    completions = own_completions + (peers.token_ids if peers else [])
    batch = pack(prompts, completions, pad_id, device)
    logp = completion_logprobs(model, batch, grpo.temperature)
    mask = batch.completion_mask.to(logp.dtype)
    n_own = len(own_completions)
    stats: dict[str, float] = {}

    if grpo.filter_zero_variance:
        keep = nonzero_variance_groups(data.rewards).reshape(-1, 1).to(mask.dtype)
        mask = torch.cat([mask[:n_own] * keep, mask[n_own:]])
        stats["filtered_groups"] = float(p_n - int(keep.reshape(p_n, g_n)[:, 0].sum()))

    logp_old = logp.detach()
    if grpo.ratio_to_behaviour:
        behaviour = torch.zeros_like(logp_old[:n_own])
        for i, s in enumerate(c for row in data.samples for c in row):
            behaviour[i, : len(s.logprobs)] = torch.tensor(s.logprobs, dtype=logp.dtype)
        logp_old = torch.cat([behaviour, logp_old[n_own:]])

    advantages = plan.advantages.reshape(-1).to(logp)
    weights = None
    if peers is not None and len(peers.token_ids):
        peer_w, peer_mask, wstats = peer_weights(logp[n_own:], mask[n_own:], plan, probe)
        weights = torch.cat([torch.ones_like(logp[:n_own]), peer_w])
        mask = torch.cat([mask[:n_own], peer_mask])
        advantages = torch.cat([advantages, peers.advantages.to(logp)])
        stats.update({f"prp_w_{k}": float(v) for k, v in wstats.items()})

    ref_logp = None
    if ref_model is not None and grpo.beta > 0:
        with torch.no_grad():
            ref_logp = completion_logprobs(ref_model, batch, grpo.temperature)

    out = grpo_loss(
        logp, logp_old, advantages, mask, grpo.eps_lo, grpo.eps_hi, grpo.beta, ref_logp,
        grpo.aggregation, max_new_tokens, weights)
    total = out.loss
    stats.update(loss_pg=out.pg_loss, kl=out.kl, clip_frac=out.clip_frac,
                 clip_frac_low=out.clip_frac_low, clip_frac_high=out.clip_frac_high,
                 tokens=float(mask.sum()))

    demos = plan.demos
    if demos is not None and demos.token_ids:
        d_prompts: Sequence[Sequence[int]] = (demos.prompt_token_ids
                                              or [prompt_ids[i] for i in demos.prompt_index])
        d_batch = pack(d_prompts, demos.token_ids, pad_id, device)
        d_logp = completion_logprobs(model, d_batch, 1.0)
        sgt = sgt_loss(d_logp, d_batch.completion_mask,
                       torch.tensor(demos.prompt_index, device=device), probe.sgt_lambda)
        total = total + sgt
        stats["loss_sgt"] = float(sgt.detach())
    stats["loss"] = float(total.detach())
    return Loss(total=total, stats=stats)
