"""SAPO: swarm sampling policy optimisation (Gensyn AI Team, "Sharing is Caring", arXiv
2509.08721; docs/design.md (13)).

A peer's whole group of completions for a question (text) joins the learner's batch as a group
of its own, keyed by (peer, question); the learner scores the completions with its own reward
functions and computes advantages within that group, exactly as for its own groups. There is no
importance weight: a peer row is trained like an own row (ratio to the learner's pre-step
log-probs, 1 in value at the round's first update), i.e. A · ∇ log π on the peer's text. The
paper drops external groups whose advantages are all 0 and trains on a fixed number of own and
external groups per round (`sapo_drop_zero_advantage`, `sapo_max_groups`).

F-TIS (`algos.ftis`) forms its advantages per source group the same way
(`per_source_advantages`). Only torch and the standard library are imported here.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Protocol

import torch
from torch import Tensor

from mutualrl.trainer.algos.hacpo import PeerGroup
from mutualrl.trainer.algos.loss import EPS, group_advantages
from mutualrl.trainer.algos.modes import ScaleRewards


class SapoSettings(Protocol):
    """SAPO's knobs (`config.ProbeSettings` has them)."""

    sapo_drop_zero_advantage: bool
    sapo_max_groups: int | None


def source_groups(sources: Sequence[str]) -> dict[str, list[int]]:
    """Row indices of each sending policy, in first-seen order."""
    out: dict[str, list[int]] = {}
    for j, src in enumerate(sources):
        out.setdefault(src, []).append(j)
    return out


def per_source_advantages(own: Tensor, peers: Sequence[PeerGroup], scale: ScaleRewards,
                          s: object = None, eps: float = EPS) -> tuple[Tensor, list[Tensor]]:
    """Own advantages ``[P, G]`` (GRPO's, untouched by the peers) and, for each prompt, the
    advantages of its peer rows within their own source's group: (1) over that group
    (`batch` scale: divided by the std of the round's own rewards, as own groups are)."""
    if len(peers) != own.shape[0]:
        raise ValueError(f"peers has {len(peers)} rows, own rewards {own.shape[0]}")
    own_adv = group_advantages(own, eps, scale)
    peer_adv: list[Tensor] = []
    for peer in peers:
        adv = torch.zeros(peer.rewards.shape[0], dtype=own.dtype)
        for idx in source_groups(peer.source).values():
            rows = torch.tensor(idx, dtype=torch.long)
            adv[rows] = group_advantages(peer.rewards[rows].to(own.dtype), eps, scale, own)
        peer_adv.append(adv)
    return own_adv, peer_adv


def chosen_groups(advantages: Sequence[Tensor], s: SapoSettings, rng: random.Random
                  ) -> list[bool]:
    """Which peer groups (one advantage vector each) the learner trains on: those with a
    non-zero advantage when `sapo_drop_zero_advantage`, then at most `sapo_max_groups` of
    them drawn uniformly without replacement by `rng` (kept in their given order)."""
    live = [not s.sapo_drop_zero_advantage or bool((a != 0).any()) for a in advantages]
    cap = s.sapo_max_groups
    alive = [i for i, ok in enumerate(live) if ok]
    if cap is not None and len(alive) > cap:
        keep = set(rng.sample(alive, cap))
        live = [i in keep for i in range(len(live))]
    return live
