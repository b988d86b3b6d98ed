"""The rules of an ExperienceRecord (pure: no grpc calls, no redis), shared by SEE, which
refuses a Publish that breaks them, and by the trainer, which checks every record it builds
before it sends it (`mutualrl.trainer.sharing.exchange`): one code, so what a trainer sends is
what SEE accepts.

Every rule raises `InvalidArgument` whose field path names the offending value exactly as a
client would write it (`records[3].reward`), so a sender can fix its input from the message.
Numbers are held to `mutualrl.common.bounds` (rounds, policy versions, rewards, a REWARD_STATS
record's count and sums), so nothing a record holds can overflow what reads it: GetRoundStats'
pooled sums, a trainer's advantages.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from google.protobuf.unknown_fields import UnknownFieldSet

from mutualrl.common import bounds, ids
from mutualrl.common.errors import InvalidArgument, quote, require_nonnegative
from mutualrl.v1 import experience_pb2 as pb

VERIFIABLE_FINISH = (pb.FINISH_REASON_STOP, pb.FINISH_REASON_EOS)
FINISH_VALUES = frozenset(pb.FinishReason.values())
KINDS: tuple[int, ...] = tuple(v for v in pb.RecordKind.values()
                               if v != pb.RECORD_KIND_UNSPECIFIED)
"""The record kinds, in enum order."""


class RecordLimits(Protocol):
    """The size limits a record is held to (SEE's `see.limits` has them all)."""

    @property
    def max_record_bytes(self) -> int: ...
    @property
    def max_text_chars(self) -> int: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def max_meta_entries(self) -> int: ...
    @property
    def max_meta_chars(self) -> int: ...


@dataclass(frozen=True, slots=True)
class DefaultLimits:
    """SEE's default limits (`see.limits`): what a sender checks its records against when it
    does not know the server's."""

    max_record_bytes: int = 1024 * 1024
    max_text_chars: int = 262_144
    max_tokens: int = 65_536
    max_meta_entries: int = 32
    max_meta_chars: int = 1024


DEFAULT_LIMITS = DefaultLimits()


def _finite(value: float, field: str) -> None:
    if not math.isfinite(value):
        raise InvalidArgument(field, "not finite")


_ARRAY_FIELDS = ("token_ids_i32", "offset_starts_i32", "offset_ends_i32", "logprobs_f32")
_V1_ARRAY_FIELDS = frozenset((11, 12, 13, 14))
_KIND_SET = frozenset(KINDS)


def _v1_arrays(rec: pb.ExperienceRecord) -> bool:
    """The record carries contract version 1's repeated arrays (unknown fields 11-14 now)."""
    try:
        fields = UnknownFieldSet(rec)
        return any(fields[i].field_number in _V1_ARRAY_FIELDS for i in range(len(fields)))
    except Exception:
        return False


@dataclass(frozen=True, slots=True)
class Batch:
    """The fields of a Publish batch the publisher needs, each read from the records once (a
    protobuf field read from Python costs a C call, and for text a copy); in record order."""

    record_id: list[str]
    prompt_id: list[str]
    policy_id: list[str]
    kind: list[int]
    round: list[int]
    policy_version: list[int]
    verified: list[bool]
    text: list[str]
    counts: list[int]
    """Tokens per record."""


def validate_records(records: Sequence[pb.ExperienceRecord], run: pb.RunConfig,
                     limits: RecordLimits, batch_bytes: int | None = None) -> Batch:
    """Check a Publish batch against the run; returns its fields (`Batch`) for the publisher.

    Every rule raises `InvalidArgument` naming the offending field (`records[3].reward`). Each
    field is read once for the whole batch and the scalar rules run as one pass of set, min
    and max tests over those columns; only a batch that fails that pass walks its records one
    by one, which names the first offending record and rule exactly as a per-record validator
    would. The per-token rules (ids >= 0, offsets inside the text with start <= end, finite
    log-probs) run once over the whole batch: one concatenation per array and a handful of
    numpy reductions, then the first offending element is traced back to its record.

    `batch_bytes`, the serialized request's size, spares the record size rule its per-record
    serialized-size walk where it cannot fail: a record is at most the request less every other
    record's four token arrays. The errors are the same, in the same order, with or without it.
    """
    # A list first: iterating the protobuf container makes each element's Python object anew.
    records = list(records)
    arrays = [[getattr(r, name) for r in records] for name in _ARRAY_FIELDS]
    nbytes = list(map(len, arrays[0]))
    text = [r.text for r in records]
    batch = Batch(
        record_id=[r.record_id for r in records], prompt_id=[r.prompt_id for r in records],
        policy_id=[r.policy_id for r in records], kind=[r.kind for r in records],
        round=[r.round for r in records], policy_version=[r.policy_version for r in records],
        verified=[r.verified for r in records], text=text, counts=[n >> 2 for n in nbytes])
    text_lens = list(map(len, text))
    if not _scalars_pass(records, batch, run, limits, arrays, nbytes, text_lens):
        policies = frozenset(run.policies)
        for i, rec in enumerate(records):
            try:
                _validate_scalars(rec, i, run, policies, limits, check_size=False)
            except InvalidArgument:
                # An earlier record's size error comes first, as when checked record by record.
                _check_sizes(records[:i], limits, None, None)
                raise
    _check_sizes(records, limits, batch.counts, batch_bytes)
    _check_arrays(arrays, batch.counts, text_lens)
    return batch


def _scalars_pass(records: Sequence[pb.ExperienceRecord], b: Batch, run: pb.RunConfig,
                  limits: RecordLimits, arrays: list[list[bytes]], nbytes: list[int],
                  text_lens: list[int]) -> bool:
    """Whether the batch keeps every rule of `_validate_scalars` (except the record size), as
    whole-column tests. False does not say which record breaks which rule: the caller then walks
    the records one by one for the exact error."""
    if not records:
        return True
    finish = [r.finish_reason for r in records]
    reward = [r.reward for r in records]
    if not (_all_valid(ids.RECORD_KEY, b.record_id) and _all_valid(ids.RECORD_KEY, b.prompt_id)
            and _all_valid(ids.TOKENIZER_ID, [t for t in (r.tokenizer_id for r in records) if t])
            and {r.run_id for r in records} <= {"", run.run_id}
            and set(b.policy_id) <= set(run.policies)
            and set(b.kind) <= _KIND_SET and set(finish) <= FINISH_VALUES
            and min(b.round) >= 0 and min(b.policy_version) >= 0
            and max(b.round) <= bounds.MAX_ROUND
            and max(b.policy_version) <= bounds.MAX_POLICY_VERSION
            and max(text_lens) <= limits.max_text_chars
            and max(map(len, [r.prompt_text for r in records])) <= limits.max_text_chars
            and all(map(math.isfinite, reward))
            and max(map(abs, reward)) <= bounds.MAX_ABS_REWARD
            and not any(n & 3 for n in nbytes) and max(nbytes) >> 2 <= limits.max_tokens
            and all(list(map(len, a)) == nbytes for a in arrays[1:])
            and not any(v and f == pb.FINISH_REASON_LENGTH
                        for v, f in zip(b.verified, finish, strict=True))):
        return False
    for meta in [r.meta for r in records]:
        # (values by key: the map's values() is a Python-level view, twice as slow)
        if meta and (len(meta) > limits.max_meta_entries
                     or max(map(len, meta)) > limits.max_meta_chars
                     or max(map(len, map(meta.__getitem__, meta))) > limits.max_meta_chars):
            return False
    for i, kind in enumerate(b.kind):
        if kind == pb.ROLLOUT:
            if not nbytes[i]:
                return False
        elif kind == pb.REWARD_STATS:
            try:
                _validate_stats(records[i], "")
            except InvalidArgument:
                return False
        elif not (b.verified[i] and reward[i] >= run.tau and finish[i] in VERIFIABLE_FINISH
                  and b.text[i].strip()):
            return False
    return True


@functools.cache
def _batch_re(rule: ids.IdRule) -> re.Pattern[str]:
    # (no rule admits a newline, so newline-terminated values cannot run into each other)
    return re.compile(f"(?:{rule.pattern[1:-1]}\n)*")


def _all_valid(rule: ids.IdRule, values: list[str]) -> bool:
    """Every value follows `rule`."""
    if not values:
        return True
    joined = "\n".join(values) + "\n"
    # (a value holding a newline would read as two: it fails the count, not the pattern)
    return (joined.count("\n") == len(values)
            and _batch_re(rule).fullmatch(joined) is not None)


def _check_sizes(records: Sequence[pb.ExperienceRecord], limits: RecordLimits,
                 counts: Sequence[int] | None, batch_bytes: int | None) -> None:
    """The record size rule, in record order; `counts` (token counts, every array checked to
    hold 4 bytes per token) with `batch_bytes` bound each record's size without measuring it."""
    limit = limits.max_record_bytes
    arrays = 16 * sum(counts) if counts is not None and batch_bytes is not None else 0
    slack = 1024 + 16 * limits.max_meta_entries
    for i, rec in enumerate(records):
        # (with room for what re-serializing adds to a wire record: a map entry that left out
        # its default key or value gets both)
        if (counts is not None and batch_bytes is not None
                and batch_bytes - (arrays - 16 * counts[i]) + slack <= limit):
            continue
        size = rec.ByteSize()
        if size > limit:
            raise InvalidArgument(f"records[{i}]", f"serialized size {size} B exceeds {limit} B")


def validate_record(rec: pb.ExperienceRecord, idx: int, run: pb.RunConfig,
                    policies: frozenset[str], limits: RecordLimits) -> int:
    """One record on its own (every rule; as `validate_records` for a batch of one, with the
    record's index `idx` in the field names); returns its token count."""
    n, text_len = _validate_scalars(rec, idx, run, policies, limits)
    _check_arrays([[getattr(rec, name)] for name in _ARRAY_FIELDS], [n], [text_len], first=idx)
    return n


def _validate_scalars(rec: pb.ExperienceRecord, idx: int, run: pb.RunConfig,
                      policies: frozenset[str], limits: RecordLimits, check_size: bool = True
                      ) -> tuple[int, int]:
    """Every rule except the per-token values (and the record size, unless `check_size`);
    returns the record's token count and text length (characters)."""
    f = f"records[{idx}]"
    ids.check_record_key(rec.record_id, f"{f}.record_id")
    ids.check_record_key(rec.prompt_id, f"{f}.prompt_id")
    tokenizer_id = rec.tokenizer_id
    if tokenizer_id:  # optional (REWARD_STATS records carry no tokens)
        ids.check_tokenizer_id(tokenizer_id, f"{f}.tokenizer_id")
    if rec.run_id and rec.run_id != run.run_id:
        raise InvalidArgument(f"{f}.run_id",
                              f"{quote(rec.run_id)} differs from the request's run_id")
    if rec.policy_id not in policies:
        raise InvalidArgument(f"{f}.policy_id",
                              f"{quote(rec.policy_id)} is not a policy of run {quote(run.run_id)}")
    kind = rec.kind
    if kind not in KINDS:
        raise InvalidArgument(f"{f}.kind",
                              f"must be ROLLOUT, REWARD_STATS or VERIFIED_SUCCESS, got {kind}")
    bounds.check_int(rec.round, f"{f}.round", bounds.MAX_ROUND)
    bounds.check_int(rec.policy_version, f"{f}.policy_version", bounds.MAX_POLICY_VERSION)
    finish = rec.finish_reason
    if finish not in FINISH_VALUES:
        raise InvalidArgument(f"{f}.finish_reason", f"unknown value {finish}")
    text = rec.text
    text_len = len(text)
    if text_len > limits.max_text_chars:
        raise InvalidArgument(f"{f}.text", f"longer than {limits.max_text_chars} characters")
    if len(rec.prompt_text) > limits.max_text_chars:
        raise InvalidArgument(f"{f}.prompt_text",
                              f"longer than {limits.max_text_chars} characters")
    reward = rec.reward
    if not math.isfinite(reward):
        raise InvalidArgument(f"{f}.reward", "not finite")
    if abs(reward) > bounds.MAX_ABS_REWARD:
        raise InvalidArgument(f"{f}.reward", f"{reward:g} is beyond +-{bounds.MAX_ABS_REWARD:g}")

    nbytes = len(rec.token_ids_i32)
    if nbytes % 4:
        raise InvalidArgument(f"{f}.token_ids_i32",
                              f"{nbytes} bytes is not a whole number of int32 values")
    n = nbytes // 4
    if n > limits.max_tokens:
        raise InvalidArgument(f"{f}.token_ids_i32", f"more than {limits.max_tokens} tokens")
    for name in _ARRAY_FIELDS[1:]:
        size = len(getattr(rec, name))
        if size != nbytes:
            raise InvalidArgument(f"{f}.{name}", f"has {size} bytes, token_ids_i32 has {nbytes}"
                                  f" ({n} tokens of 4 bytes)")

    meta = rec.meta
    if meta:
        if len(meta) > limits.max_meta_entries:
            raise InvalidArgument(f"{f}.meta", f"more than {limits.max_meta_entries} entries")
        for key, value in meta.items():
            if len(key) > limits.max_meta_chars or len(value) > limits.max_meta_chars:
                raise InvalidArgument(f"{f}.meta[{quote(key)}]",
                                      f"key or value longer than {limits.max_meta_chars} "
                                      "characters")

    verified = rec.verified
    if verified and finish == pb.FINISH_REASON_LENGTH:
        raise InvalidArgument(f"{f}.verified", "a truncated completion (LENGTH) is never verified")
    if kind == pb.ROLLOUT:
        if n == 0:
            hint = (" (this client sends contract version 1's repeated arrays, fields 11-14;"
                    " contract version 2 carries them as little-endian bytes: token_ids_i32,"
                    " offset_starts_i32, offset_ends_i32, logprobs_f32)"
                    if _v1_arrays(rec) else "")
            raise InvalidArgument(f"{f}.token_ids_i32",
                                  "a ROLLOUT needs its tokens and log-probs" + hint)
    elif kind == pb.REWARD_STATS:
        _validate_stats(rec, f)
    else:  # VERIFIED_SUCCESS
        if not verified:
            raise InvalidArgument(f"{f}.verified", "a VERIFIED_SUCCESS must have verified=true")
        if reward < run.tau:
            raise InvalidArgument(f"{f}.reward", f"{reward} is below the run's tau {run.tau}")
        if finish not in VERIFIABLE_FINISH:
            raise InvalidArgument(f"{f}.finish_reason",
                                  "a VERIFIED_SUCCESS must have finished with STOP or EOS")
        if not text.strip():
            raise InvalidArgument(f"{f}.text", "a VERIFIED_SUCCESS needs its completion text")
    if check_size:
        size = rec.ByteSize()
        if size > limits.max_record_bytes:
            raise InvalidArgument(f, f"serialized size {size} B exceeds "
                                     f"{limits.max_record_bytes} B")
    return n, text_len


def _check_arrays(arrays: list[list[bytes]], counts: Sequence[int], text_lens: Sequence[int],
                  first: int = 0) -> None:
    """Token ids >= 0, offsets inside the text with start <= end, log-probs finite: over the
    whole batch at once. `arrays`: the records' four token arrays (`_ARRAY_FIELDS` order);
    `counts`: their token counts (already checked to agree)."""
    if not any(counts):
        return
    tok, starts, ends = (np.frombuffer(b"".join(a), dtype="<i4") for a in arrays[:3])
    lps = np.frombuffer(b"".join(arrays[3]), dtype="<f4")
    n_of = np.fromiter(counts, dtype=np.int64, count=len(counts))
    text_len = np.fromiter(text_lens, dtype=np.int64, count=len(text_lens))
    # Fast pass, no temporaries beyond one mask per rule: an offset read as uint32 is above
    # the (uint32) text length exactly when it is negative or past the text. Only a batch
    # that fails it pays for the pass below that finds the first offending element.
    limit_u = np.repeat(text_len.astype(np.uint32), n_of)
    if (tok.min() >= 0 and not (starts.view(np.uint32) > limit_u).any()
            and not (ends.view(np.uint32) > limit_u).any() and not (starts > ends).any()
            and np.isfinite(lps).all()):
        return
    limit = np.repeat(text_len, n_of)
    # (bad elements, field, message) in the order the per-record validator checked them.
    checks: list[tuple[np.ndarray, str, str | None]] = [
        (tok < 0, "token_ids_i32", "must be >= 0"),
        ((starts < 0) | (starts > limit), "offset_starts_i32", None),
        ((ends < 0) | (ends > limit), "offset_ends_i32", None),
        (starts > ends, "offset_ends_i32", "an end lies before its start"),
        (~np.isfinite(lps), "logprobs_f32", "not finite"),
    ]
    if not any(bad.any() for bad, _, _ in checks):  # pragma: no cover (the fast pass said so)
        return
    bounds = np.cumsum(n_of)
    # The first offending record, then the first rule it breaks (side="right" steps over
    # records without tokens, whose bounds repeat the previous one).
    firsts = [int(np.searchsorted(bounds, int(np.argmax(bad)), side="right"))
              if bad.any() else len(counts) for bad, _, _ in checks]
    rec_pos = min(firsts)
    rule = firsts.index(rec_pos)
    _, name, msg = checks[rule]
    if msg is None:
        msg = f"must lie in [0, {int(text_len[rec_pos])}]"
    raise InvalidArgument(f"records[{first + rec_pos}].{name}", msg)


def _validate_stats(rec: pb.ExperienceRecord, f: str) -> None:
    if not rec.HasField("stats"):
        raise InvalidArgument(f"{f}.stats", "a REWARD_STATS record needs stats")
    st = rec.stats
    check_stats(st.count, st.sum, st.sum_sq, st.max, f"{f}.stats",
                st.success_max if st.HasField("success_max") else None)


STATS_RELATIVE_TOLERANCE = 1e-9
"""Rounding room of `check_stats`' comparisons, relative to the magnitudes compared."""


def check_stats(count: int, total: float, sum_sq: float, top: float, f: str,
                success_max: float | None = None) -> None:
    """The rules of a group's reward statistics (`f`: their field path, "records[3].stats"):
    1 <= count <= MAX_GROUP_SIZE, finite sums of rewards within +-MAX_ABS_REWARD, a variance
    that is not negative and a max not below the mean. `success_max` (a success reward other
    than the reward the sums are over) is finite and within +-MAX_ABS_REWARD; it bears no
    relation to the sums. GetRoundStats holds what it reads back to the same rules (records
    stored before a rule existed)."""
    if success_max is not None:
        _finite(success_max, f"{f}.success_max")
        if abs(success_max) > bounds.MAX_ABS_REWARD:
            raise InvalidArgument(f"{f}.success_max",
                                  f"{success_max:g} is beyond +-{bounds.MAX_ABS_REWARD:g}")
    bounds.check_int(count, f"{f}.count", bounds.MAX_GROUP_SIZE, least=1)
    for name, value in (("sum", total), ("sum_sq", sum_sq), ("max", top)):
        _finite(value, f"{f}.{name}")
    require_nonnegative(f"{f}.sum_sq", sum_sq)
    most = bounds.MAX_ABS_REWARD
    # Rewards within +-most: the max, the mean and the mean square are too (with rounding room).
    if abs(top) > most:
        raise InvalidArgument(f"{f}.max", f"{top:g} is beyond +-{most:g}")
    mean = total / count
    if abs(mean) > most * (1 + 1e-9):
        raise InvalidArgument(f"{f}.sum", f"a mean of {mean:g} is beyond +-{most:g}")
    if sum_sq / count > most * most * (1 + 1e-9):
        raise InvalidArgument(f"{f}.sum_sq", f"a mean square of {sum_sq / count:g} is beyond "
                              f"{most * most:g} (rewards within +-{most:g})")
    # The variance is mean_sq - mean**2: each term carries rounding error relative to its own
    # size (float64 sums of up to 2^20 rewards: far below STATS_RELATIVE_TOLERANCE), so the
    # room is relative to the larger of them, never to the unscaled sums.
    mean_sq = sum_sq / count
    if mean_sq - mean * mean < -STATS_RELATIVE_TOLERANCE * max(mean * mean, mean_sq):
        raise InvalidArgument(f"{f}.sum_sq", f"implies a negative variance "
                              f"({mean_sq - mean * mean:g}): sum_sq/count is below "
                              "(sum/count)**2")
    if top < mean - STATS_RELATIVE_TOLERANCE * max(abs(mean), abs(top)):
        raise InvalidArgument(f"{f}.max", "smaller than the mean sum/count")
