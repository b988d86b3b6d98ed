"""Helpers for tests and the benchmark: realistic records and an in-process SEE on free ports."""

from __future__ import annotations

import contextlib
import random
import zlib
from collections.abc import AsyncIterator
from typing import Any

from mutualrl.common.token_arrays import set_tokens
from mutualrl.see.config import SeeConfig
from mutualrl.v1 import experience_pb2 as pb

TEST_PREFIX = "mrltest"
_WORDS = ("the", "answer", "is", "so", "we", "add", "then", "carry", "one", "gives", "total",
          "step", "first", "next", "multiply", "by", "two", "three", "ten", "result")


def completion(n_tokens: int, seed: int = 0) -> tuple[str, list[int], list[int], list[int],
                                                      list[float]]:
    """A text of `n_tokens` word-ish tokens with ids, character offsets and log-probs."""
    rng = random.Random(seed)
    parts: list[str] = []
    ids: list[int] = []
    starts: list[int] = []
    ends: list[int] = []
    pos = 0
    for i in range(n_tokens):
        piece = ("" if i == 0 else " ") + rng.choice(_WORDS)
        parts.append(piece)
        starts.append(pos)
        pos += len(piece)
        ends.append(pos)
        ids.append(rng.randrange(4, 50_000))
    logprobs = [-rng.expovariate(2.0) for _ in range(n_tokens)]
    return "".join(parts), ids, starts, ends, logprobs


def rollout(policy: str, round_: int, prompt: str, sample: int, *, n_tokens: int = 16,
            reward: float = 0.0, version: int | None = None, run_id: str = "",
            verified: bool = False) -> pb.ExperienceRecord:
    seed = zlib.crc32(f"{policy}/{round_}/{prompt}/{sample}".encode())
    text, ids, starts, ends, lps = completion(n_tokens, seed=seed)
    return set_tokens(pb.ExperienceRecord(
        record_id=f"{policy}/{round_}/{prompt}/{sample}", run_id=run_id, policy_id=policy,
        policy_version=round_ if version is None else version, round=round_, prompt_id=prompt,
        kind=pb.ROLLOUT, prompt_text=f"Question {prompt}?", text=text,
        tokenizer_id=f"tok-{policy}", reward=reward, verified=verified,
        finish_reason=pb.FINISH_REASON_EOS, meta={"skill": "add"}), ids, starts, ends, lps)


def stats_record(policy: str, round_: int, prompt: str, rewards: list[float]
                 ) -> pb.ExperienceRecord:
    return pb.ExperienceRecord(
        record_id=f"{policy}/{round_}/{prompt}/stats", policy_id=policy, policy_version=round_,
        round=round_, prompt_id=prompt, kind=pb.REWARD_STATS,
        stats=pb.RewardStats(count=len(rewards), sum=sum(rewards),
                             sum_sq=sum(r * r for r in rewards), max=max(rewards)))


def success_record(policy: str, round_: int, prompt: str, text: str, sample: int = 0,
                   reward: float = 1.0) -> pb.ExperienceRecord:
    return pb.ExperienceRecord(
        record_id=f"{policy}/{round_}/{prompt}/ok{sample}", policy_id=policy,
        policy_version=round_, round=round_, prompt_id=prompt, kind=pb.VERIFIED_SUCCESS,
        prompt_text=f"Question {prompt}?", text=text, reward=reward, verified=True,
        finish_reason=pb.FINISH_REASON_STOP)


def make_config(redis_url: str, **overrides: Any) -> SeeConfig:
    """SEE on free ports with the private test key prefix and auth off unless given."""
    base: dict[str, Any] = dict(port=0, rest_port=0, redis_url=redis_url, key_prefix=TEST_PREFIX,
                                auth_token=None, grace_seconds=0.5)
    base.update(overrides)
    return SeeConfig.model_validate(base)


@contextlib.asynccontextmanager
async def running_see(cfg: SeeConfig) -> AsyncIterator[Any]:
    """An in-process SEE (gRPC + REST) for the duration of the block."""
    from mutualrl.see.server import start_see

    see = await start_see(cfg)
    try:
        yield see
    finally:
        await see.stop(0.2)
