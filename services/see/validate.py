"""Validation of runs and records (pure: no grpc, no redis).

Every rule raises `InvalidArgument` whose field path names the offending value exactly as a
client would write it (`records[3].reward`), so a trainer can fix its input from the message.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

import numpy as np

from mutualrl.common.errors import InvalidArgument
from mutualrl.see import wire
from mutualrl.see.config import SeeLimits
from mutualrl.see.wire import RecordHead, count_varints, decode_packed_varints, packed_ranges_fast
from mutualrl.v1 import experience_pb2 as pb

RUN_ID_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
# Ids end up inside Redis hash fields joined with "|": control characters and the separator
# would make them ambiguous.
_BAD_ID_CHARS = re.compile(r"[\x00-\x1f\x7f|]")
_WS = re.compile(r"\s+")

KIND_NAMES: dict[int, str] = {
    pb.ROLLOUT: "ROLLOUT",
    pb.REWARD_STATS: "REWARD_STATS",
    pb.VERIFIED_SUCCESS: "VERIFIED_SUCCESS",
}
KIND_BY_NAME: dict[str, int] = {v: k for k, v in KIND_NAMES.items()}
VERIFIABLE_FINISH = (pb.FINISH_REASON_STOP, pb.FINISH_REASON_EOS)
FINISH_VALUES = frozenset(pb.FinishReason.values())


def normalise_text(text: str) -> str:
    """The text successes are deduplicated on: whitespace runs collapsed to one space, stripped."""
    return _WS.sub(" ", text).strip()


def text_digest(text: str) -> str:
    """Short stable digest of the normalised text (the dedup key stored in Redis)."""
    return hashlib.blake2b(normalise_text(text).encode(), digest_size=12).hexdigest()


def check_run_id(run_id: str, field: str = "run_id") -> str:
    if not RUN_ID_RE.match(run_id):
        raise InvalidArgument(field, f"must match [A-Za-z0-9._-]{{1,64}}, got {run_id!r}")
    return run_id


def _check_id(value: str, field: str, limits: SeeLimits, *, required: bool = True) -> None:
    if not value:
        if required:
            raise InvalidArgument(field, "required")
        return
    if len(value) > limits.max_id_chars:
        raise InvalidArgument(field, f"longer than {limits.max_id_chars} characters")
    if _BAD_ID_CHARS.search(value):
        raise InvalidArgument(field, "must not contain control characters or '|'")


def validate_run_config(cfg: pb.RunConfig, limits: SeeLimits) -> None:
    """A run needs an id, at least one distinct policy, a finite tau and non-negative caps."""
    check_run_id(cfg.run_id, "config.run_id")
    if not cfg.policies:
        raise InvalidArgument("config.policies", "at least one policy is required")
    if len(cfg.policies) > 256:
        raise InvalidArgument("config.policies", "at most 256 policies")
    seen: set[str] = set()
    for i, policy in enumerate(cfg.policies):
        _check_id(policy, f"config.policies[{i}]", limits)
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


def validate_record(rec: Any, idx: int, run: pb.RunConfig,
                    policies: frozenset[str], limits: SeeLimits, raw: bytes | None = None,
                    batch: ArrayBatch | None = None) -> int:
    """Check one record of a Publish batch against the run; returns its serialized size.

    `rec` is a parsed ExperienceRecord, or a `RecordHead` (the record without its token arrays)
    together with `raw` and `batch`. `policies` is the run's policy set (precomputed once per
    batch); `raw` the record's serialized bytes when the caller has them (the token arrays are
    then checked on them, for the whole batch at once).
    Field paths are only formatted on failure: this runs for every published record.
    """
    rid, prompt, tok = rec.record_id, rec.prompt_id, rec.tokenizer_id
    max_id = limits.max_id_chars
    # One regex pass over the three ids; the slow path below names the culprit.
    if (not rid or not prompt or len(rid) > max_id or len(prompt) > max_id or len(tok) > max_id
            or _BAD_ID_CHARS.search(f"{rid}{prompt}{tok}")):
        f = f"records[{idx}]"
        _check_id(rid, f"{f}.record_id", limits)
        _check_id(prompt, f"{f}.prompt_id", limits)
        _check_id(tok, f"{f}.tokenizer_id", limits, required=False)
    if rec.run_id and rec.run_id != run.run_id:
        raise InvalidArgument(f"records[{idx}].run_id",
                              f"{rec.run_id!r} differs from the request's run_id")
    if rec.policy_id not in policies:
        raise InvalidArgument(f"records[{idx}].policy_id",
                              f"{rec.policy_id!r} is not a policy of run {run.run_id!r}")
    kind = rec.kind
    if kind not in KIND_NAMES:
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

    if isinstance(rec, RecordHead):
        # The arrays are only in `raw`: counted and checked by the batch.
        n = batch.add_head(f"records[{idx}]", rec, raw) if batch is not None and raw else None
        if n is None:  # unusual layout (unpacked arrays): check the fully parsed record
            full = pb.ExperienceRecord.FromString(raw or b"")
            return validate_record(full, idx, run, policies, limits, raw, None)
        if n > limits.max_tokens:
            raise InvalidArgument(f"records[{idx}].token_ids",
                                  f"more than {limits.max_tokens} tokens")
    else:
        n = len(rec.token_ids)
        if n > limits.max_tokens:
            raise InvalidArgument(f"records[{idx}].token_ids",
                                  f"more than {limits.max_tokens} tokens")
        if len(rec.offset_starts) != n or len(rec.offset_ends) != n or len(rec.logprobs) != n:
            for name in ("offset_starts", "offset_ends", "logprobs"):
                if len(getattr(rec, name)) != n:
                    raise InvalidArgument(f"records[{idx}].{name}",
                                          f"has {len(getattr(rec, name))} entries, "
                                          f"token_ids has {n}")
        if n:
            _check_arrays(rec, f"records[{idx}]", n, raw, batch)

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
    size = len(raw) if raw is not None else rec.ByteSize()
    if size > limits.max_record_bytes:
        raise InvalidArgument(f"records[{idx}]",
                              f"serialized size {size} B exceeds {limits.max_record_bytes} B")
    return size


def _check_arrays(rec: pb.ExperienceRecord, f: str, n: int, raw: bytes | None,
                  batch: ArrayBatch | None) -> None:
    """Token ids >= 0, offsets inside the text with start <= end, log-probs finite.

    With `batch`, the record's packed arrays are queued and checked for the whole Publish batch
    at once (a few numpy operations per batch instead of per record)."""
    if raw is not None and batch is not None:
        ranges = packed_ranges_fast(raw, rec)
        if ranges is not None and len(ranges) == 4:
            batch.add(f, rec, raw, ranges, n)
            return
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


# Every negative int32 is a 10-byte varint ending in these bytes (bits 35..63 all set); a
# non-negative int32 contains them only as the single value 2**29 - 1, re-checked exactly.
_NEG_TAIL = b"\xff\xff\xff\xff\x01"


class ArrayBatch:
    """Packed token arrays of a Publish batch, checked together on the serialized bytes."""

    def __init__(self) -> None:
        self.fields: list[str] = []
        self.counts: list[int] = []
        self.text_lens: list[int] = []
        self.ids: list[bytes] = []
        self.offsets: list[bytes] = []
        self.logprobs: list[bytes] = []
        self.suspect_ids: list[str] = []
        self.heads: list[bool] = []

    def add_head(self, f: str, rec: Any, raw: bytes) -> int | None:
        """Queue the arrays of a record parsed as a RecordHead; returns its token count
        (from the log-probs, 4 bytes each; the others are counted in `check`), or None when
        the arrays are not laid out as four packed fields."""
        ranges = packed_ranges_fast(raw, rec)
        if ranges is None:
            return None
        if not ranges:
            return 0
        if len(ranges) != 4:
            return None
        s14, e14 = ranges[wire.F_LOGPROBS]
        if (e14 - s14) % 4:
            return None
        n = (e14 - s14) // 4
        s11, e11 = ranges[wire.F_TOKEN_IDS]
        if raw.find(_NEG_TAIL, s11, e11) >= 0:
            full = pb.ExperienceRecord.FromString(raw)
            if len(full.token_ids) == n and min(full.token_ids) < 0:
                raise InvalidArgument(f"{f}.token_ids", "must be >= 0")
        self.ids.append(raw[s11:e11])
        self.heads.append(True)
        self._queue(f, rec.text, raw, ranges, n)
        return n

    def _queue(self, f: str, text: str, raw: bytes, ranges: dict[int, tuple[int, int]],
               n: int) -> None:
        s12, e12 = ranges[wire.F_OFFSET_STARTS]
        s13, e13 = ranges[wire.F_OFFSET_ENDS]
        s14, e14 = ranges[wire.F_LOGPROBS]
        self.fields.append(f)
        self.counts.append(n)
        self.text_lens.append(len(text))
        self.offsets.append(raw[s12:e12])
        self.offsets.append(raw[s13:e13])
        self.logprobs.append(raw[s14:e14])

    def add(self, f: str, rec: pb.ExperienceRecord, raw: bytes,
            ranges: dict[int, tuple[int, int]], n: int) -> None:
        s, e = ranges[wire.F_TOKEN_IDS]
        if raw.find(_NEG_TAIL, s, e) >= 0:
            self.suspect_ids.append(f)
            if min(rec.token_ids) < 0:
                raise InvalidArgument(f"{f}.token_ids", "must be >= 0")
        s14, e14 = ranges[wire.F_LOGPROBS]
        if e14 - s14 != 4 * n:
            raise InvalidArgument(f"{f}.logprobs", "malformed packed floats")
        self.ids.append(raw[s:e])
        self.heads.append(False)
        self._queue(f, rec.text, raw, ranges, n)

    def _first(self, bad: np.ndarray, per_record: np.ndarray) -> str:
        """Field path of the record that owns the first True of `bad` (values laid out as
        `per_record[i]` values per record)."""
        pos = int(np.flatnonzero(bad)[0])
        return self.fields[int(np.searchsorted(np.cumsum(per_record), pos, side="right"))]

    def check(self) -> None:
        if not self.fields:
            return
        counts = np.asarray(self.counts, dtype=np.int64)
        # Element counts of records parsed as heads (a full parse already compared them).
        for f, n, ids, starts, ends, head in zip(self.fields, self.counts, self.ids,
                                                  self.offsets[0::2], self.offsets[1::2],
                                                  self.heads, strict=True):
            if not head:
                continue
            n_ids = count_varints(ids)
            if n_ids != n:
                raise InvalidArgument(f"{f}.logprobs", f"has {n} entries, token_ids has {n_ids}")
            for name, seg in (("offset_starts", starts), ("offset_ends", ends)):
                k = count_varints(seg)
                if k != n:
                    raise InvalidArgument(f"{f}.{name}", f"has {k} entries, token_ids has {n}")
        # Offsets: all starts decoded in one pass, all ends in another (aligned record by
        # record), checked against each record's text length.
        total = int(counts.sum())
        starts_all = decode_packed_varints(b"".join(self.offsets[0::2]), 0,
                                           sum(map(len, self.offsets[0::2])))
        ends_all = decode_packed_varints(b"".join(self.offsets[1::2]), 0,
                                         sum(map(len, self.offsets[1::2])))
        if starts_all is None or ends_all is None or starts_all.size != total \
                or ends_all.size != total:
            self._find_bad_offsets()
        assert starts_all is not None and ends_all is not None
        limit = np.repeat(np.asarray(self.text_lens, dtype=np.int64), counts)
        for name, vals in (("offset_starts", starts_all), ("offset_ends", ends_all)):
            over = vals > limit
            if over.any():
                i = int(np.searchsorted(np.cumsum(counts), int(np.flatnonzero(over)[0]),
                                        side="right"))
                raise InvalidArgument(f"{self.fields[i]}.{name}",
                                      f"must lie in [0, {self.text_lens[i]}]")
        bad = starts_all > ends_all
        if bad.any():
            raise InvalidArgument(f"{self._first(bad, counts)}.offset_ends",
                                  "an end lies before its start")
        lps = np.frombuffer(b"".join(self.logprobs), dtype="<f4")
        finite = np.isfinite(lps)
        if not finite.all():
            raise InvalidArgument(f"{self._first(~finite, counts)}.logprobs", "not finite")

    def _find_bad_offsets(self) -> None:
        for i, f in enumerate(self.fields):
            for j, which in ((0, "offset_starts"), (1, "offset_ends")):
                seg = self.offsets[2 * i + j]
                v = decode_packed_varints(seg, 0, len(seg))
                if v is None or v.size != self.counts[i]:
                    raise InvalidArgument(f"{f}.{which}", "must lie in "
                                                          f"[0, {self.text_lens[i]}]")
        raise InvalidArgument("records", "malformed packed offsets")


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
