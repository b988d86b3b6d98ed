"""What every probe shares: the round's data in, the loss inputs out, and the fall-back to GRPO.

A probe turns the round's own rewards (and whatever it reads from peers) into `LossInputs`: the
advantages of own samples, optionally peer rows to add to the policy-gradient batch (PRP) and
demonstrations for an extra NLL term (SGT). With no exchange (local runs), no peer data, a
missed deadline or a service error, the inputs are exactly plain GRPO's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from mutualrl.trainer.algos.grpo import group_advantages
from mutualrl.trainer.config import ProbeSettings
from mutualrl.trainer.exchange import PeerExchange
from mutualrl.trainer.tasks import Prompt

log = logging.getLogger(__name__)


@dataclass
class RoundData:
    """One round of one policy after rewards."""

    round: int
    prompts: list[Prompt]
    samples: list[list[Any]]
    """[P][G] rollout samples (token_ids, text, logprobs, finish_reason)."""
    rewards: Tensor
    """[P, G] rewards."""


@dataclass
class PeerRows:
    """PRP: peer completions in the receiver's tokens joining own groups."""

    prompt_index: list[int]
    token_ids: list[list[int]]
    advantages: Tensor
    """[M] advantage of each peer row over own + peer rewards."""
    sender_logp_sum: Tensor
    """[M] sender's sequence log-prob (sequence-level weights)."""
    token_chunk: list[list[int]] | None = None
    """Chunk level: chunk index per receiver token."""
    chunk_sender_logp: list[list[float]] | None = None
    """Chunk level: sender log-prob per chunk."""


@dataclass
class Demos:
    """SGT: verified peer successes (receiver tokens) of rescued prompts."""

    prompt_index: list[int]
    token_ids: list[list[int]]


@dataclass
class LossInputs:
    """What `update.py` needs besides the samples to build a round's loss."""

    advantages: Tensor
    """[P, G] advantages of own samples."""
    peers: PeerRows | None = None
    demos: Demos | None = None
    stats: dict[str, float] = field(default_factory=dict)


def grpo_inputs(data: RoundData, **stats: float) -> LossInputs:
    return LossInputs(advantages=group_advantages(data.rewards), stats=dict(stats))


class Probe:
    """Plain GRPO (probe `none`); subclasses override `gather`."""

    kind = "none"

    def __init__(
        self, settings: ProbeSettings, policy: str, exchange: PeerExchange | None
    ) -> None:
        self.settings = settings
        self.policy = policy
        self.exchange = exchange
        self.fallbacks = 0
        """Rounds that fell back to GRPO: a service error, or the deadline passed with no peer
        data at all."""

    def plan(self, data: RoundData) -> LossInputs:
        """The round's loss inputs; peers are read within `deadline_seconds`, else plain GRPO."""
        if self.exchange is None or self.kind == "none":
            return grpo_inputs(data, fallback=0.0)
        deadline = time.monotonic() + self.settings.deadline_seconds
        try:
            plan = self.gather(data, self.exchange, deadline)
        except Exception as err:  # grpc.RpcError (deadline, unavailable) and THL refusals
            if not _is_transient(err):
                raise
            log.warning("round %d: %s probe fell back to GRPO: %s", data.round, self.kind, err)
            plan = grpo_inputs(data, fallback=1.0)
        plan.stats.setdefault("fallback", 0.0)
        self.fallbacks += int(plan.stats["fallback"] > 0)
        plan.stats["fallbacks_total"] = float(self.fallbacks)
        return plan

    def gather(self, data: RoundData, ex: PeerExchange, deadline: float) -> LossInputs:
        return grpo_inputs(data)

    def state_dict(self) -> dict[str, Any]:
        return {"fallbacks": self.fallbacks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.fallbacks = int(state.get("fallbacks", 0))


def _is_transient(err: BaseException) -> bool:
    """Errors a peer or a service can cause: everything gRPC reports, and timeouts."""
    try:
        import grpc
    except ImportError:  # pragma: no cover - grpc is a core dependency
        return isinstance(err, TimeoutError)
    return isinstance(err, grpc.RpcError | TimeoutError | ConnectionError)


def own_max(data: RoundData) -> dict[str, float]:
    """Best own reward per prompt id."""
    return {p.id: float(r.max()) for p, r in zip(data.prompts, data.rewards, strict=True)}


def index_of(prompts: Sequence[Prompt]) -> dict[str, int]:
    return {p.id: i for i, p in enumerate(prompts)}


def as_tensor(values: Sequence[float], like: Tensor) -> Tensor:
    return torch.tensor(list(values), dtype=like.dtype)
