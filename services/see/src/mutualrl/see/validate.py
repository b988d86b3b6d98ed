"""Validation of runs (pure: no grpc, no redis), and the record rules SEE applies to a Publish,
which live in `mutualrl.common.records` so that trainers check their records with the same code.

Every rule raises `InvalidArgument` whose field path names the offending value exactly as a
client would write it (`config.retention.ttl_seconds`).
"""

from __future__ import annotations

import hashlib
import math
import re

from mutualrl.common import ids
from mutualrl.common.errors import InvalidArgument, quote, require_nonnegative
from mutualrl.see.config import SeeLimits
from mutualrl.v1 import experience_pb2 as pb

_WS = re.compile(r"\s+")


# Upper bounds of a run's retention: Redis refuses an expire time whose milliseconds overflow
# int64, and the publish script reads these as Lua numbers (exact integers up to 2^53).
MAX_TTL_SECONDS = 100 * 366 * 24 * 3600
RETENTION_BOUNDS = {"max_stream_len": 1_000_000_000, "ttl_seconds": MAX_TTL_SECONDS,
                    "max_rounds": 10_000_000}


def normalise_text(text: str) -> str:
    """The text successes are deduplicated on: whitespace runs collapsed to one space, stripped."""
    return _WS.sub(" ", text).strip()


def text_digest(text: str) -> str:
    """Short stable digest of the normalised text (the dedup key stored in Redis)."""
    return hashlib.blake2b(normalise_text(text).encode(), digest_size=12).hexdigest()


def validate_run_config(cfg: pb.RunConfig, limits: SeeLimits) -> None:
    """A run needs an id, at least one distinct policy, a finite tau and non-negative caps."""
    ids.check_run_id(cfg.run_id, "config.run_id")
    if not cfg.policies:
        raise InvalidArgument("config.policies", "at least one policy is required")
    if len(cfg.policies) > 256:
        raise InvalidArgument("config.policies", "at most 256 policies")
    seen: set[str] = set()
    for i, policy in enumerate(cfg.policies):
        ids.check_name(policy, f"config.policies[{i}]")
        if policy in seen:
            raise InvalidArgument(f"config.policies[{i}]", f"duplicate policy {quote(policy)}")
        seen.add(policy)
    if not math.isfinite(cfg.tau):
        raise InvalidArgument("config.tau", "not finite")
    for name, bound in RETENTION_BOUNDS.items():
        value = getattr(cfg.retention, name)
        require_nonnegative(f"config.retention.{name}", value)
        if value > bound:
            raise InvalidArgument(f"config.retention.{name}",
                                  f"{value} is above the largest allowed, {bound}")


