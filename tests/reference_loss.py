"""The round's loss by its definition (docs/design.md (8)), in one forward pass over every row:
the reference the memory-bounded step (`trainer.runtime.step`) is tested against. It holds the
logits of the whole batch, so it is for tests and tiny models only.

GRPO (3)-(5) over own (+ peer) rows, weighted by PRP's importance weights (9), plus SGT's
rescue term (7). PRP's importance weights use the receiver's pre-step log-probs of the peer
tokens, detached, so they are constants of the step as the estimator requires. Peer rows of the
published methods (12)-(14), from their definitions here, not from `algos.methods`: HACPO's
rows take −clip(s, l_0, 1) · sg(clip(s, l_0, 1))^α · w · A (one update: m = 0) with no KL;
SAPO's take GRPO's loss unweighted; F-TIS's take it times min(π/π_gen, C) per chunk, negative
rows whose KL estimate passes the gate left out. Sequences are given as token-id lists; prompts
in the receiver's tokens are shared by own rows, peer rows and demonstrations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mutualrl.trainer.algos.loss import (
    aggregate,
    entropy_bonus,
    grpo_loss,
    nonzero_variance_groups,
    token_loss,
)
from mutualrl.trainer.algos.prp import peer_weights
from mutualrl.trainer.algos.sgt import sgt_loss
from mutualrl.trainer.config.run import GRPOSettings, ProbeSettings
from mutualrl.trainer.model.batch import completion_logprobs, completion_logprobs_and_entropy, pack
from mutualrl.trainer.sharing.probes.base import LossInputs, PeerRows, RoundData


@dataclass
class Loss:
    total: Tensor
    stats: dict[str, float]


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
    entropy = None
    if grpo.entropy_coef != 0.0:
        logp, entropy = completion_logprobs_and_entropy(model, batch, grpo.temperature)
    else:
        logp = completion_logprobs(model, batch, grpo.temperature)
    mask = batch.completion_mask.to(logp.dtype)
    n_own = len(own_completions)
    stats: dict[str, float] = {}

    if grpo.filter_zero_variance:
        # A group goes when its rewards are equal and its advantages are 0 (a shared baseline
        # can give equal rewards a signal).
        signal = (plan.advantages.abs() > 1e-6).any(-1, keepdim=True)
        keep = (nonzero_variance_groups(data.rewards) | signal).reshape(-1, 1).to(mask.dtype)
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
    method = peers.method if peers is not None else "prp"
    if peers is not None and len(peers.token_ids):
        if method == "prp":
            peer_w, peer_mask, wstats = peer_weights(logp[n_own:], mask[n_own:], peers, probe)
            stats.update({f"prp_w_{k}": float(v) for k, v in wstats.items()})
        elif method == "ftis":
            peer_w, peer_mask = _ftis(logp[n_own:].detach(), mask[n_own:], peers, probe)
        else:  # SAPO: unweighted; HACPO: its rows' own loss below
            peer_w, peer_mask = torch.ones_like(logp[n_own:]), mask[n_own:]
        weights = torch.cat([torch.ones_like(logp[:n_own]), peer_w])
        mask = torch.cat([mask[:n_own], peer_mask])
        advantages = torch.cat([advantages, peers.advantages.to(logp)])

    ref_logp = None
    if ref_model is not None and grpo.beta > 0:
        with torch.no_grad():
            ref_logp = completion_logprobs(ref_model, batch, grpo.temperature)

    if peers is not None and len(peers.token_ids) and method in ("hacpo", "hacpo-naive"):
        parts = token_loss(logp, logp_old, advantages, grpo, ref_logp, weights, mask)
        cross = _hacpo_rows(logp[n_own:], mask[n_own:], advantages[n_own:], peers, probe)
        total_t = torch.cat([parts.total[:n_own], cross])
        pg_t = torch.cat([parts.pg[:n_own], cross])
        total = aggregate(total_t, mask, grpo.aggregation, max_new_tokens)
        if entropy is not None and grpo.entropy_coef != 0.0:
            total = total + entropy_bonus(entropy, mask, grpo.entropy_coef)
        pg = aggregate(pg_t.detach(), mask, grpo.aggregation, max_new_tokens)
        stats.update(loss_pg=float(pg), tokens=float(mask.sum()))
    else:
        out = grpo_loss(logp, logp_old, advantages, mask, grpo, ref_logp, weights, entropy,
                        max_new_tokens)
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


def _hacpo_rows(logp: Tensor, mask: Tensor, adv: Tensor, peers: PeerRows,
                probe: ProbeSettings) -> Tensor:
    """HACPO's peer rows, m = 0: s = exp(mean_t logp − sender sum / sender tokens), clamped
    in log space, c = clip(s, 1 − δ, 1); value −c · c.detach()^α · w · A on every token."""
    assert peers.sender_tokens is not None
    out = []
    for i in range(logp.shape[0]):
        n = mask[i].sum()
        log_s = (logp[i] * mask[i]).sum() / n - float(peers.sender_logp_sum[i]) / float(
            peers.sender_tokens[i])
        log_s = log_s.clamp(-probe.hacpo_max_log_ratio, probe.hacpo_max_log_ratio)
        c = torch.exp(log_s).clamp(1.0 - probe.hacpo_delta, 1.0)
        w = 1.0 if peers.capability is None else float(peers.capability[i])
        value = -c * c.detach() ** probe.hacpo_alpha * w * adv[i]
        out.append(value * torch.ones_like(logp[i]))
    return torch.stack(out)


def _ftis(logp: Tensor, mask: Tensor, peers: PeerRows, probe: ProbeSettings
          ) -> tuple[Tensor, Tensor]:
    """F-TIS's weights and mask, chunk by chunk: w_c = min(exp(Σ_c logp − Σ_c π_gen), C) on
    the chunk's tokens; a row with A < 0 and Σ_c (r log r − r + 1) > g is left out."""
    assert peers.token_chunk is not None and peers.chunk_sender_logp is not None
    w = torch.zeros_like(logp)
    keep = mask.clone()
    for i, (tc, sc) in enumerate(zip(peers.token_chunk, peers.chunk_sender_logp, strict=True)):
        kl = 0.0
        for c, send in enumerate(sc):
            toks = [j for j, cj in enumerate(tc) if cj == c]
            r = math.exp(sum(float(logp[i, j]) for j in toks) - send)
            kl += r * math.log(r) - r + 1.0
            for j in toks:
                w[i, j] = min(r, probe.ftis_cap)
        if float(peers.advantages[i]) < 0 and kl > probe.ftis_kl_gate:
            keep[i] = 0.0
    return w, keep
