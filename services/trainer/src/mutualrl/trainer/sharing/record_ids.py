"""The ids of the records a trainer publishes to SEE, built and parsed in one place:
`<policy>/<round>/<prompt>/<sample>/r` (a ROLLOUT), `.../<sample>/s` (its VERIFIED_SUCCESS) and
`<policy>/<round>/<prompt>/stats` (the prompt's REWARD_STATS), `<prompt>` being the prompt's
index in its round. Policy names hold no `/` (`mutualrl.common.ids.NAME`), so the fields never
run into each other. PRP orders peer rollouts by these fields: an id of another form is an
error naming it, never a silent default."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Part = Literal["r", "s", "stats"]
ROLLOUT: Part = "r"
SUCCESS: Part = "s"
STATS: Part = "stats"


@dataclass(frozen=True)
class RecordId:
    """The fields of a trainer's record id (`sample` None for REWARD_STATS)."""

    policy: str
    round: int
    prompt: int
    sample: int | None
    part: Part

    def build(self) -> str:
        base = f"{self.policy}/{self.round}/{self.prompt}"
        if self.part == STATS:
            return f"{base}/{STATS}"
        return f"{base}/{self.sample}/{self.part}"


def rollout_id(policy: str, round_k: int, prompt: int, sample: int) -> str:
    return RecordId(policy, round_k, prompt, sample, ROLLOUT).build()


def success_id(policy: str, round_k: int, prompt: int, sample: int) -> str:
    return RecordId(policy, round_k, prompt, sample, SUCCESS).build()


def stats_id(policy: str, round_k: int, prompt: int) -> str:
    return RecordId(policy, round_k, prompt, None, STATS).build()


def parse_record_id(record_id: str) -> RecordId:
    """The fields of `record_id`; ValueError naming it when it is not of the trainers' form."""
    parts = record_id.split("/")
    try:
        if len(parts) == 4 and parts[3] == STATS:
            return RecordId(parts[0], int(parts[1]), int(parts[2]), None, STATS)
        if len(parts) == 5 and parts[4] in (ROLLOUT, SUCCESS):
            part: Part = ROLLOUT if parts[4] == ROLLOUT else SUCCESS
            return RecordId(parts[0], int(parts[1]), int(parts[2]), int(parts[3]), part)
    except ValueError:
        pass
    raise ValueError(f"record id {record_id[:100]!r} is not <policy>/<round>/<prompt>/<sample>/"
                     "r|s nor <policy>/<round>/<prompt>/stats")
