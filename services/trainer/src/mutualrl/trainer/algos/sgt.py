"""SGT: success-gated transfer (docs/design.md (7)).

Rescue set R_i = prompts where policy i's best own reward is below tau and some *other* policy
has a verified success (reward >= tau, not truncated). For those prompts the receiver adds

    L_SGT = -lambda * mean_x mean_{y in S_x} (1/|y|) sum_t log pi_i(y_t | x, y_<t)

with y retokenized into policy i's tokens. Unverified peer outputs and own successes never enter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class PeerSuccess:
    """One peer completion offered as a candidate demonstration."""

    prompt_id: str
    policy: str
    text: str
    reward: float
    truncated: bool = False
    verified: bool = True
    stopped_by_eos: bool = False
    """The peer's generation ended with its EOS (the text does not show it)."""


def rescue_set(
    own_max_reward: Mapping[str, float],
    candidates: Iterable[PeerSuccess],
    own_policy: str,
    tau: float = 1.0,
    max_per_prompt: int | None = None,
) -> dict[str, list[str]]:
    """Prompt id -> distinct peer success texts (first-seen order) for the prompts to rescue.

    Only prompts this policy answered this round (keys of ``own_max_reward``) can be rescued,
    and only when none of its own samples reached ``tau``.
    """
    rescued: dict[str, list[str]] = {}
    for c in candidates:
        if c.policy == own_policy or not c.verified or c.truncated or c.reward < tau:
            continue
        own = own_max_reward.get(c.prompt_id)
        if own is None or own >= tau:
            continue
        texts = rescued.setdefault(c.prompt_id, [])
        if c.text not in texts and (max_per_prompt is None or len(texts) < max_per_prompt):
            texts.append(c.text)
    return rescued


def sgt_loss(token_logp: Tensor, mask: Tensor, prompt_index: Tensor, lam: float) -> Tensor:
    """-lambda * mean over prompts of (mean over that prompt's demonstrations of the
    length-normalised log-likelihood): L_SGT of docs/design.md (7).

    ``token_logp`` / ``mask``: ``[N, T]`` receiver log-probs of the N demonstration tokens;
    ``prompt_index``: ``[N]`` integer id of each demonstration's prompt (any labels).
    Returns a zero scalar (still differentiable) when N == 0.
    """
    if token_logp.shape[0] == 0:
        return token_logp.sum() * 0.0
    m = mask.to(token_logp.dtype)
    per_seq = (token_logp * m).sum(dim=-1) / m.sum(dim=-1).clamp(min=1.0)
    _, group = torch.unique(prompt_index, return_inverse=True)
    num_prompts = int(group.max()) + 1
    sums = per_seq.new_zeros(num_prompts).index_add(0, group, per_seq)
    counts = per_seq.new_zeros(num_prompts).index_add(0, group, torch.ones_like(per_seq))
    return -lam * (sums / counts).mean()
