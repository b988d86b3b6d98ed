"""The names of the loss's modes (docs/algorithms.md): aggregation, reward scale and the level
of the importance ratio. No torch, so configs can validate them without importing the math."""

from __future__ import annotations

from typing import Literal

Aggregation = Literal["token_mean", "sequence_mean", "constant_length"]
"""How the per-token losses reduce to a scalar, named for what they compute (docs/design.md (4))."""
PAPER_NAMES: dict[str, Aggregation] = {
    "dapo": "token_mean", "grpo": "sequence_mean", "dr_grpo": "constant_length"}
"""The names the papers use, accepted as aliases (DAPO, GRPO, Dr. GRPO)."""
AGGREGATIONS: tuple[Aggregation, ...] = ("token_mean", "sequence_mean", "constant_length")

ScaleRewards = Literal["group", "batch", "none"]
"""What a group's centred rewards are divided by: the group's std, the round's std, or nothing
(Dr. GRPO; TRL's `scale_rewards`)."""
SCALES: tuple[ScaleRewards, ...] = ("group", "batch", "none")

RatioLevel = Literal["token", "sequence"]
"""The importance ratio per token (GRPO, DAPO) or one per sequence, the geometric mean of its
tokens' (GSPO; TRL's `importance_sampling_level`)."""
RATIO_LEVELS: tuple[RatioLevel, ...] = ("token", "sequence")


def aggregation_mode(name: str) -> Aggregation:
    """The aggregation mode `name` means: a mode's own name or a paper's name for it."""
    if name in PAPER_NAMES:
        return PAPER_NAMES[name]
    for mode in AGGREGATIONS:
        if name == mode:
            return mode
    raise ValueError(f"unknown aggregation mode {name!r}: one of {AGGREGATIONS} "
                     f"(or the paper names {tuple(PAPER_NAMES)})")

OffPolicyCorrection = Literal["tis", "mis", "none"]
"""How rows sampled by older weights are weighted (`algos.offpolicy.CORRECTIONS`)."""
