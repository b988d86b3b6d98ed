"""The batch validator against per-record and per-element oracles: its whole-batch pass over
the scalar rules, its vectorised per-token rules, and the contract-2 array rules (whole
int32/float32 values, equal lengths)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mutualrl.bench.testing.see import rollout, stats_record, success_record
from mutualrl.common import token_arrays as ta
from mutualrl.common.errors import InvalidArgument
from mutualrl.common.records import _validate_scalars, validate_records
from mutualrl.see.config import SeeLimits
from mutualrl.v1 import experience_pb2 as pb

RUN = pb.RunConfig(run_id="r1", policies=["a", "b"], tau=1.0)
LIM = SeeLimits()


def _oracle(records: list[pb.ExperienceRecord]) -> str | None:
    """The field the first offending record breaks first, element by element in Python."""
    for i, rec in enumerate(records):
        n = len(rec.text)
        tok, st_, en, lp = (ta.token_ids(rec).tolist(), ta.offset_starts(rec).tolist(),
                            ta.offset_ends(rec).tolist(), ta.logprobs(rec).tolist())
        rules = [
            ("token_ids_i32", any(t < 0 for t in tok)),
            ("offset_starts_i32", any(not 0 <= s <= n for s in st_)),
            ("offset_ends_i32", any(not 0 <= e <= n for e in en)),
            ("offset_ends_i32", any(s > e for s, e in zip(st_, en, strict=True))),
            ("logprobs_f32", any(not math.isfinite(x) for x in lp)),
        ]
        for name, bad in rules:
            if bad:
                return f"records[{i}].{name}"
    return None


def _put(rec: pb.ExperienceRecord, field: str, i: int, value: float) -> None:
    dtype = ta.F32 if field == "logprobs_f32" else ta.I32
    arr = np.frombuffer(getattr(rec, field), dtype=dtype).copy()
    arr[i] = value
    setattr(rec, field, arr.tobytes())


_CHANGES = st.tuples(
    st.sampled_from(["token_ids_i32", "offset_starts_i32", "offset_ends_i32", "logprobs_f32"]),
    st.integers(0, 5),
    st.one_of(st.integers(-3, 200), st.sampled_from([math.nan, math.inf, -math.inf, -2.5])))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_CHANGES, max_size=3), min_size=1, max_size=6))
def test_batch_rules_match_the_per_element_oracle(changes: list[list[tuple[str, int, float]]]
                                                  ) -> None:
    records = []
    for j, recs_changes in enumerate(changes):
        rec = rollout("a", 0, f"p{j}", j, n_tokens=6)
        for field, i, value in recs_changes:
            if field != "logprobs_f32" and isinstance(value, float):
                continue  # ints only in int32 arrays
            _put(rec, field, i, value)
        records.append(rec)
    expected = _oracle(records)
    if expected is None:
        assert validate_records(records, RUN, LIM).counts == [6] * len(records)
        return
    with pytest.raises(InvalidArgument) as err:
        validate_records(records, RUN, LIM)
    assert err.value.field == expected, (err.value.field, expected)


def test_large_batch_names_the_last_record() -> None:
    records = [rollout("a", 0, "p", i, n_tokens=32) for i in range(4096)]
    assert validate_records(records, RUN, LIM).counts == [32] * 4096
    _put(records[4095], "logprobs_f32", 31, math.nan)
    with pytest.raises(InvalidArgument, match=r"records\[4095\]\.logprobs_f32"):
        validate_records(records, RUN, LIM)


@pytest.mark.parametrize(("field", "extra", "message"), [
    ("token_ids_i32", b"\0\0", "not a whole number"),
    ("offset_starts_i32", b"\0\0\0\0", "token_ids_i32 has"),
    ("logprobs_f32", b"\0\0\0", "token_ids_i32 has"),
])
def test_array_lengths_are_whole_and_equal(field: str, extra: bytes, message: str) -> None:
    rec = rollout("a", 0, "p", 0, n_tokens=4)
    setattr(rec, field, getattr(rec, field) + extra)
    with pytest.raises(InvalidArgument, match=message) as err:
        validate_records([rec], RUN, LIM)
    assert err.value.field == f"records[0].{field}"


def test_views_are_zero_copy_and_little_endian() -> None:
    rec = rollout("a", 0, "p", 0, n_tokens=3)
    ta.set_tokens(rec, [1, 2, 70_000], [0, 1, 2], [1, 2, 3], [-0.5, -1.0, -2.0])
    assert rec.token_ids_i32 == b"\x01\0\0\0\x02\0\0\0\x70\x11\x01\0"
    raw = rec.token_ids_i32
    view = np.frombuffer(raw, dtype=ta.I32)
    assert not view.flags.owndata and view.tolist() == [1, 2, 70_000]
    assert ta.logprobs(rec).dtype == np.float32 and ta.logprobs(rec).tolist() == [-0.5, -1, -2]
    assert ta.n_tokens(rec) == 3


def _batch_bytes(records: list[pb.ExperienceRecord]) -> int:
    return len(pb.PublishRequest(run_id="r1", records=records).SerializeToString())


@pytest.mark.parametrize("with_batch_bytes", [False, True])
def test_record_size_rule_with_and_without_the_request_size(with_batch_bytes: bool) -> None:
    lim = SeeLimits(max_record_bytes=4096)
    records = [rollout("a", 0, "p", i, n_tokens=50) for i in range(40)]
    bb = _batch_bytes(records) if with_batch_bytes else None
    assert bb is None or bb > lim.max_record_bytes  # the bound decides, not the request size
    assert validate_records(records, RUN, lim, batch_bytes=bb).counts == [50] * 40
    big = rollout("a", 0, "p", 99, n_tokens=300)  # ~4.8 kB of arrays alone
    records[7] = big
    bb = _batch_bytes(records) if with_batch_bytes else None
    with pytest.raises(InvalidArgument, match="serialized size") as err:
        validate_records(records, RUN, lim, batch_bytes=bb)
    assert err.value.field == "records[7]"
    # An earlier oversized record is named before a later record's other error.
    records[9].policy_id = "nope"
    bb = _batch_bytes(records) if with_batch_bytes else None
    with pytest.raises(InvalidArgument) as err:
        validate_records(records, RUN, lim, batch_bytes=bb)
    assert err.value.field == "records[7]"
    records[7] = rollout("a", 0, "p", 7, n_tokens=50)
    bb = _batch_bytes(records) if with_batch_bytes else None
    with pytest.raises(InvalidArgument) as err:
        validate_records(records, RUN, lim, batch_bytes=bb)
    assert err.value.field == "records[9].policy_id"


@pytest.mark.parametrize(("field", "value"), [
    ("record_id", ""), ("record_id", "a|b"), ("record_id", "a\nb"), ("record_id", "x" * 257),
    ("prompt_id", "p\x00"), ("prompt_id", ""), ("tokenizer_id", "-tok"),
    ("tokenizer_id", "t" * 129), ("tokenizer_id", "a\nb")])
def test_batch_id_rules_name_the_record(field: str, value: str) -> None:
    records = [rollout("a", 0, "p", i, n_tokens=4) for i in range(8)]
    assert validate_records(records, RUN, LIM).counts == [4] * 8
    setattr(records[5], field, value)
    with pytest.raises(InvalidArgument) as err:
        validate_records(records, RUN, LIM)
    assert err.value.field == f"records[5].{field}"
    records[5] = rollout("a", 0, "p", 5, n_tokens=4)
    setattr(records[5], field, "x" * (256 if field != "tokenizer_id" else 128))
    assert validate_records(records, RUN, LIM).counts == [4] * 8


# Small limits, so that the boundaries are reachable with small records.
SMALL = SeeLimits(max_text_chars=40, max_tokens=8, max_meta_entries=2, max_meta_chars=6)
_BAD_I32 = b"\x01\x00\x00"  # 3 bytes: not a whole int32
_SCALAR_CHANGES = st.sampled_from([
    ("record_id", ""), ("record_id", "a|b"), ("record_id", "ok-id"), ("prompt_id", ""),
    ("tokenizer_id", "-t"), ("tokenizer_id", ""), ("run_id", "r2"), ("run_id", "r1"),
    ("policy_id", "c"), ("policy_id", "b"), ("kind", 0), ("kind", 4), ("kind", pb.ROLLOUT),
    ("kind", pb.REWARD_STATS), ("kind", pb.VERIFIED_SUCCESS), ("round", -1), ("round", 2**31 - 1),
    ("policy_version", -1), ("finish_reason", 9), ("finish_reason", pb.FINISH_REASON_LENGTH),
    ("finish_reason", pb.FINISH_REASON_STOP), ("text", "x" * 41), ("text", "x" * 40),
    ("text", " \t"), ("text", ""), ("prompt_text", "q" * 41), ("reward", math.nan),
    ("reward", -math.inf), ("reward", 0.5), ("reward", 1.0), ("verified", True),
    ("verified", False), ("token_ids_i32", b""), ("token_ids_i32", _BAD_I32),
    ("logprobs_f32", b"\x00" * 4), ("token_ids_i32", b"\x00" * 36), ("meta", {"k": "v" * 7}),
    ("meta", {"k" * 7: "v"}), ("meta", {"a": "1", "b": "2", "c": "3"}), ("meta", {"a": "1"}),
    ("stats", None), ("stats.max", -1.0), ("stats.sum_sq", -1.0), ("stats.count", 0)])


def _change(rec: pb.ExperienceRecord, field: str, value: object) -> None:
    if field == "meta":
        rec.meta.clear()
        rec.meta.update(value)  # type: ignore[call-overload]
    elif field == "stats":
        rec.ClearField("stats")
    elif field.startswith("stats."):
        setattr(rec.stats, field.split(".")[1], value)
    else:
        setattr(rec, field, value)


def _first_scalar_error(records: list[pb.ExperienceRecord], limits: SeeLimits) -> str | None:
    """The per-record oracle: the first record's first broken scalar rule, in record order."""
    for i, rec in enumerate(records):
        try:
            _validate_scalars(rec, i, RUN, frozenset(RUN.policies), limits)
        except InvalidArgument as err:
            return f"{err.field}: {err.message}"
    return None


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["rollout", "stats", "success"]),
                          st.lists(_SCALAR_CHANGES, max_size=2)), min_size=1, max_size=5))
def test_whole_batch_pass_names_what_the_per_record_walk_names(
        batch: list[tuple[str, list[tuple[str, object]]]]) -> None:
    """A batch passes the column tests exactly when no record breaks a scalar rule, and a
    failing batch is refused with the first record's first rule, as record by record."""
    records = []
    for j, (kind, changes) in enumerate(batch):
        if kind == "rollout":
            rec = rollout("a", 0, f"p{j}", j, n_tokens=4)
        elif kind == "stats":
            rec = stats_record("a", 0, f"p{j}", [1.0, 0.0])
        else:
            rec = success_record("b", 0, f"p{j}", "x = 1", sample=j)
        for field, value in changes:
            _change(rec, field, value)
        records.append(rec)
    expected = _first_scalar_error(records, SMALL)
    if expected is None:
        try:
            validate_records(records, RUN, SMALL)
        except InvalidArgument as err:  # only the per-token rules are left to break
            assert err.field.split(".")[-1] in {"token_ids_i32", "offset_starts_i32",
                                                "offset_ends_i32", "logprobs_f32"}, err
        return
    with pytest.raises(InvalidArgument) as err:
        validate_records(records, RUN, SMALL)
    assert f"{err.value.field}: {err.value.message}" == expected
