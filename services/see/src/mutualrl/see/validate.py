"""Validation of runs and records (pure: no grpc, no redis).

Every rule raises `InvalidArgument` whose field path names the offending value exactly as a
client would write it (`records[3].reward`), so a trainer can fix its input from the message.
"""

from __future__ import annotations

import hashlib
import math
import re

import numpy as np

from mutualrl.common import ids
from mutualrl.common.errors import InvalidArgument
from mutualrl.see.config import SeeLimits
from mutualrl.see.keys import KINDS
from mutualrl.v1 import experience_pb2 as pb

_WS = re.compile(r"\s+")

VERIFIABLE_FINISH = (pb.FINISH_REASON_STOP, pb.FINISH_REASON_EOS)
FINISH_VALUES = frozenset(pb.FinishReason.values())


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
            raise InvalidArgument(f"config.policies[{i}]", f"duplicate policy {policy!r}")
        seen.add(policy)
    if not math.isfinite(cfg.tau):
        raise InvalidArgument("config.tau", "not finite")
    for name in ("max_stream_len", "ttl_seconds", "max_rounds"):
        if getattr(cfg.retention, name) < 0:
            raise InvalidArgument(f"config.retention.{name}", "must be >= 0")


def _finite(value: float, field: str) -> None:
    if not math.isfinite(value):
        raise InvalidArgument(field, "not finite")


def validate_record(rec: pb.ExperienceRecord, idx: int, run: pb.RunConfig,
                    policies: frozenset[str], limits: SeeLimits, size: int | None = None) -> int:
    """Check one record of a Publish batch against the run; returns its serialized size.

    The reference validator: every rule, on a fully parsed record, with the offending field
    named. `policies` is the run's policy set; `size` the record's serialized size when the
    caller has its bytes. Publish runs it for every record the compiled scan
    (`hotpath.scan_request`) does not accept.
    """
    f = f"records[{idx}]"
    ids.check_record_key(rec.record_id, f"{f}.record_id")
    ids.check_record_key(rec.prompt_id, f"{f}.prompt_id")
    if rec.tokenizer_id:  # optional (REWARD_STATS records carry no tokens)
        ids.check_tokenizer_id(rec.tokenizer_id, f"{f}.tokenizer_id")
    if rec.run_id and rec.run_id != run.run_id:
        raise InvalidArgument(f"records[{idx}].run_id",
                              f"{rec.run_id!r} differs from the request's run_id")
    if rec.policy_id not in policies:
        raise InvalidArgument(f"records[{idx}].policy_id",
                              f"{rec.policy_id!r} is not a policy of run {run.run_id!r}")
    kind = rec.kind
    if kind not in KINDS:
        raise InvalidArgument(f"records[{idx}].kind",
                              f"must be ROLLOUT, REWARD_STATS or VERIFIED_SUCCESS, got {kind}")
    if rec.round < 0:
        raise InvalidArgument(f"records[{idx}].round", "must be >= 0")
    if rec.policy_version < 0:
        raise InvalidArgument(f"records[{idx}].policy_version", "must be >= 0")
    finish = rec.finish_reason
    if finish not in FINISH_VALUES:
        raise InvalidArgument(f"records[{idx}].finish_reason", f"unknown value {finish}")
    text = rec.text
    if len(text) > limits.max_text_chars:
        raise InvalidArgument(f"records[{idx}].text",
                              f"longer than {limits.max_text_chars} characters")
    if len(rec.prompt_text) > limits.max_text_chars:
        raise InvalidArgument(f"records[{idx}].prompt_text",
                              f"longer than {limits.max_text_chars} characters")
    reward = rec.reward
    if not math.isfinite(reward):
        raise InvalidArgument(f"records[{idx}].reward", "not finite")

    n = len(rec.token_ids)
    if n > limits.max_tokens:
        raise InvalidArgument(f"records[{idx}].token_ids", f"more than {limits.max_tokens} tokens")
    for name in ("offset_starts", "offset_ends", "logprobs"):
        if len(getattr(rec, name)) != n:
            raise InvalidArgument(f"records[{idx}].{name}",
                                  f"has {len(getattr(rec, name))} entries, token_ids has {n}")
    if n:
        _check_arrays(rec, f"records[{idx}]")

    meta = rec.meta
    if meta:
        if len(meta) > limits.max_meta_entries:
            raise InvalidArgument(f"records[{idx}].meta",
                                  f"more than {limits.max_meta_entries} entries")
        for key, value in meta.items():
            if len(key) > limits.max_meta_chars or len(value) > limits.max_meta_chars:
                raise InvalidArgument(f"records[{idx}].meta[{key[:32]!r}]",
                                      f"key or value longer than {limits.max_meta_chars} "
                                      "characters")

    verified = rec.verified
    if verified and finish == pb.FINISH_REASON_LENGTH:
        raise InvalidArgument(f"records[{idx}].verified",
                              "a truncated completion (LENGTH) is never verified")
    if kind == pb.ROLLOUT:
        if n == 0:
            raise InvalidArgument(f"records[{idx}].token_ids",
                                  "a ROLLOUT needs its tokens and log-probs")
    elif kind == pb.REWARD_STATS:
        _validate_stats(rec, f"records[{idx}]")
    else:  # VERIFIED_SUCCESS
        if not verified:
            raise InvalidArgument(f"records[{idx}].verified",
                                  "a VERIFIED_SUCCESS must have verified=true")
        if reward < run.tau:
            raise InvalidArgument(f"records[{idx}].reward",
                                  f"{reward} is below the run's tau {run.tau}")
        if finish not in VERIFIABLE_FINISH:
            raise InvalidArgument(f"records[{idx}].finish_reason",
                                  "a VERIFIED_SUCCESS must have finished with STOP or EOS")
        if not text.strip():
            raise InvalidArgument(f"records[{idx}].text",
                                  "a VERIFIED_SUCCESS needs its completion text")
    size = rec.ByteSize() if size is None else size
    if size > limits.max_record_bytes:
        raise InvalidArgument(f"records[{idx}]",
                              f"serialized size {size} B exceeds {limits.max_record_bytes} B")
    return size


def _check_arrays(rec: pb.ExperienceRecord, f: str) -> None:
    """Token ids >= 0, offsets inside the text with start <= end, log-probs finite."""
    ids = np.array(rec.token_ids, dtype=np.int64)
    starts = np.array(rec.offset_starts, dtype=np.int64)
    ends = np.array(rec.offset_ends, dtype=np.int64)
    lps = np.array(rec.logprobs, dtype=np.float64)
    text_len = len(rec.text)
    if ids.min() < 0:
        raise InvalidArgument(f"{f}.token_ids", "must be >= 0")
    if starts.min() < 0 or starts.max() > text_len:
        raise InvalidArgument(f"{f}.offset_starts", f"must lie in [0, {text_len}]")
    if ends.min() < 0 or ends.max() > text_len:
        raise InvalidArgument(f"{f}.offset_ends", f"must lie in [0, {text_len}]")
    if (starts > ends).any():
        raise InvalidArgument(f"{f}.offset_ends", "an end lies before its start")
    if not np.isfinite(lps).all():
        raise InvalidArgument(f"{f}.logprobs", "not finite")


def _validate_stats(rec: pb.ExperienceRecord, f: str) -> None:
    if not rec.HasField("stats"):
        raise InvalidArgument(f"{f}.stats", "a REWARD_STATS record needs stats")
    st = rec.stats
    if st.count < 1:
        raise InvalidArgument(f"{f}.stats.count", "must be >= 1")
    for name in ("sum", "sum_sq", "max"):
        _finite(getattr(st, name), f"{f}.stats.{name}")
    if st.sum_sq < 0:
        raise InvalidArgument(f"{f}.stats.sum_sq", "must be >= 0")
    mean = st.sum / st.count
    # Relative tolerance: sums of floats carry rounding error proportional to their size.
    tol = 1e-9 * max(1.0, abs(st.sum_sq), abs(st.sum))
    if st.sum_sq / st.count - mean * mean < -tol:
        raise InvalidArgument(f"{f}.stats.sum_sq", "smaller than sum**2/count (negative variance)")
    if st.max < mean - tol:
        raise InvalidArgument(f"{f}.stats.max", "smaller than the mean sum/count")
