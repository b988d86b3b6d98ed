"""Stability-support measurements of one round (the paper's trade-off, made measurable).

- *Support*: the mean per-token log-prob the policy assigns, before the round's step, to peers'
  verified successes on the prompts it failed. A probe that transfers (SGT) should raise it
  round after round; one that only reweights own samples should leave it where it is.
- *Stability*: the per-token KL of the policy to its starting weights (the warm start), exact
  over the vocabulary at the positions of the round's own samples.

Both run without gradient and in eval mode (no dropout draw), so they change no update in
exact arithmetic; in floating point a run with them on is identical to one without only for a
while (the `short` demo: 87 rounds), as their extra work can change the last bits of a later
step. Compare runs with the same diagnostics settings.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from mutualrl.trainer.model.batch import Batch, completion_logprobs, pack
from mutualrl.trainer.runtime.session import Session
from mutualrl.trainer.sharing.probes.base import (
    Demos,
    LossInputs,
    RoundData,
    is_transient,
    read_rescue,
    rescue_demos,
)

log = logging.getLogger(__name__)


@contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was)


def demos_logp(model: torch.nn.Module, prompt_ids: Sequence[Sequence[int]], demos: Demos,
               pad_id: int, temperature: float = 1.0) -> tuple[float, int]:
    """(mean per-token log-prob, token count) of the demonstrations under `model`."""
    device = next(model.parameters()).device
    prompts: Sequence[Sequence[int]] = (demos.prompt_token_ids
                                        or [prompt_ids[i] for i in demos.prompt_index])
    batch = pack(prompts, demos.token_ids, pad_id, device)
    with _eval_mode(model):
        logp = completion_logprobs(model, batch, temperature)
    mask = batch.completion_mask.to(logp.dtype)
    n = int(mask.sum())
    return (float((logp * mask).sum() / n) if n else 0.0), n


def support(s: Session, data: RoundData, plan: LossInputs, prompt_ids: Sequence[Sequence[int]]
            ) -> dict[str, float]:
    """Support metrics of the round: `support_logp` (mean per-token log-prob of peer successes
    on failed prompts), `support_tokens`, `support_prompts`. Uses the texts the probe read when
    it read them (SGT family), else reads them from SEE within the probe's deadline (the
    deterministic mode: waits for the peers' round, then reads exactly it); {} when the
    services are off or did not answer."""
    demos = plan.support
    if demos is None:
        if s.exchange is None:
            return {}
        deadline = time.monotonic() + s.cfg.probe.deadline_seconds
        exact = s.probe.deterministic
        try:
            if exact:  # the peers' round itself, as the deterministic mode reads it
                s.exchange.await_round(data.round, [p.id for p in data.prompts],
                                       s.cfg.exchange.liveness_timeout_s, data.peers_now)
            rescue = read_rescue(data, s.exchange, s.cfg.probe, s.policy.name, deadline,
                                 exact=exact)
            demos = (rescue_demos(data, s.exchange, rescue.texts, rescue.ends)
                     if rescue.texts else None)
        except Exception as err:
            if not is_transient(err):
                raise
            log.warning("round %d: support not measured: %s", data.round, err)
            return {}
    if demos is None or not len(demos):
        return {"support_prompts": 0.0}
    mean, n = demos_logp(s.model, prompt_ids, demos, s.tokenizer.pad_token_id)
    return {"support_logp": mean, "support_tokens": float(n),
            "support_prompts": float(len(set(demos.prompt_index)))}


def _completion_log_softmax(model: torch.nn.Module, batch: Batch,
                            temperature: float) -> torch.Tensor:
    """[B, T, V] log-probabilities over the vocabulary at every completion position."""
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                position_ids=batch.position_ids, use_cache=False)
    t = batch.completion_ids.shape[1]
    logits = out.logits[:, batch.prompt_len - 1 : batch.prompt_len - 1 + t].float()
    return torch.log_softmax(logits / temperature, dim=-1)


def kl_to_start(model: torch.nn.Module, start: torch.nn.Module,
                prompt_ids: Sequence[Sequence[int]], data: RoundData, n: int, pad_id: int,
                temperature: float = 1.0) -> dict[str, float]:
    """`kl_warm`: KL(pi(.|ctx) || pi_0(.|ctx)) summed exactly over the vocabulary and averaged
    over the completion positions of the first `n` own samples of the round (the contexts the
    policy visits). Exact per position, so far less noisy than a sampled estimate. Needs the two
    models to share a vocabulary (the start is the policy's own warm start)."""
    rows = [(p, y.token_ids) for p, row in enumerate(data.samples) for y in row][:n]
    rows = [(p, ids) for p, ids in rows if ids]
    if not rows:
        return {}
    device = next(model.parameters()).device
    batch = pack([prompt_ids[p] for p, _ in rows], [ids for _, ids in rows], pad_id, device)
    with _eval_mode(model):
        cur = _completion_log_softmax(model, batch, temperature)
    with _eval_mode(start):
        ref = _completion_log_softmax(start, batch, temperature)
    kl = (cur.exp() * (cur - ref)).sum(-1)  # [B, T]
    mask = batch.completion_mask.to(kl.dtype)
    return {"kl_warm": float((kl * mask).sum() / mask.sum().clamp(min=1.0))}


def measure(s: Session, k: int, data: RoundData, plan: LossInputs,
            prompt_ids: Sequence[Sequence[int]]) -> dict[str, float]:
    """The diagnostics due at round `k` (`trainer.diagnostics`), before the round's step."""
    d = s.cfg.diagnostics
    out: dict[str, float] = {}
    if d.support_every and k % d.support_every == 0:
        out.update(support(s, data, plan, prompt_ids))
    if d.kl_every and k % d.kl_every == 0 and s.ref_model is not None:
        out.update(kl_to_start(s.model, s.ref_model, prompt_ids, data, d.kl_samples,
                               s.tokenizer.pad_token_id, s.cfg.grpo.temperature))
    return out
