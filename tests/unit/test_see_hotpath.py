"""The compiled Publish fast path: sound (it never accepts what the reference validator
rejects), used for what trainers send, and every rejection named by the reference."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mutualrl.common.errors import InvalidArgument
from mutualrl.see import hotpath as hp
from mutualrl.see.config import SeeLimits
from mutualrl.see.testing import rollout, stats_record, success_record
from mutualrl.see.validate import validate_record
from mutualrl.see.wire import encode_varint
from mutualrl.v1 import experience_pb2 as pb

RUN = pb.RunConfig(run_id="r1", policies=["a", "b"], tau=1.0)
LIM = SeeLimits()


def _body(recs: list[pb.ExperienceRecord]) -> bytes:
    return pb.PublishRequest(run_id="r1", records=recs).SerializeToString()


def _fast(body: bytes) -> list[bool]:
    """Per record: did the compiled scan accept it (before the run/policy check)?"""
    return [not row[hp.C_FALLBACK] for row in hp.scan_request(body, LIM).rows]


def test_trainer_records_take_the_fast_path_with_their_fields() -> None:
    recs = [rollout("a", 3, f"p{i}", i, n_tokens=300, reward=float(i % 2), version=7)
            for i in range(5)]
    recs[1].run_id = "r1"
    recs[2].verified = True
    body = _body(recs)
    assert _fast(body) == [True] * 5
    got = hp.accept_records(body, hp.scan_request(body, LIM), RUN, LIM)
    for rec, acc in zip(recs, got, strict=True):
        assert acc.parsed is None  # the fast path, not the reference
        assert (acc.record_id.decode(), acc.policy_id.decode(), acc.prompt_id.decode()) == (
            rec.record_id, rec.policy_id, rec.prompt_id)
        assert (acc.kind, acc.round, acc.policy_version, acc.verified) == (
            pb.ROLLOUT, 3, 7, rec.verified)
        assert pb.ExperienceRecord.FromString(body[acc.start:acc.end]) == rec


def test_other_kinds_and_unusual_encodings_go_to_the_reference_and_pass() -> None:
    uni = rollout("a", 0, "p", 1, n_tokens=4)
    uni.text += " é"  # non-ASCII: byte and character counts differ
    uni.offset_ends[-1] = len(uni.text)
    big_id = rollout("a", 0, "p", 2, n_tokens=10)
    big_id.token_ids[4] = 2**29 - 1  # a 5-byte varint
    recs = [stats_record("a", 0, "p", [1.0, 0.0]), success_record("b", 0, "p", "42;"), uni,
            big_id]
    body = _body(recs)
    assert _fast(body) == [False] * 4
    got = hp.accept_records(body, hp.scan_request(body, LIM), RUN, LIM)
    assert [a.parsed for a in got] == recs
    # Unpacked token_ids (legal protobuf, written by hand): reference path, accepted.
    rec = rollout("a", 0, "p", 3, n_tokens=3)
    base = pb.ExperienceRecord()
    base.CopyFrom(rec)
    base.ClearField("token_ids")
    raw = base.SerializeToString() + b"".join(b"\x58" + encode_varint(t) for t in rec.token_ids)
    body = b"\x0a\x02r1\x12" + encode_varint(len(raw)) + raw
    assert _fast(body) == [False]
    (acc,) = hp.accept_records(body, hp.scan_request(body, LIM), RUN, LIM)
    assert list(acc.parsed.token_ids) == list(rec.token_ids)  # type: ignore[union-attr]


Change = Callable[[pb.ExperienceRecord], object]


@pytest.mark.parametrize(("idx", "field", "change"), [
    (2, "records[2].offset_ends", lambda r: r.offset_ends.__setitem__(3, 99_999)),
    (1, "records[1].offset_starts", lambda r: r.offset_starts.__setitem__(0, len(r.text) + 1)),
    (0, "records[0].offset_ends", lambda r: r.offset_ends.__setitem__(5, r.offset_starts[5] - 1)),
    (3, "records[3].logprobs", lambda r: r.logprobs.__setitem__(9, math.inf)),
    (3, "records[3].logprobs", lambda r: r.logprobs.__setitem__(0, math.nan)),
    (1, "records[1].token_ids", lambda r: r.token_ids.__setitem__(9, -3)),
    (2, "records[2].offset_starts", lambda r: r.offset_starts.__setitem__(9, -3)),
    (0, "records[0].reward", lambda r: setattr(r, "reward", math.nan)),
    (1, "records[1].reward", lambda r: setattr(r, "reward", -math.inf)),
    (2, "records[2].logprobs", lambda r: r.logprobs.append(0.0)),
    (3, "records[3].offset_starts", lambda r: r.offset_starts.pop()),
    (0, "records[0].record_id", lambda r: setattr(r, "record_id", "")),
    (1, "records[1].prompt_id", lambda r: setattr(r, "prompt_id", "x|y")),
    (2, "records[2].tokenizer_id", lambda r: setattr(r, "tokenizer_id", "t\x01")),
    (3, "records[3].policy_id", lambda r: setattr(r, "policy_id", "zz")),
    (0, "records[0].run_id", lambda r: setattr(r, "run_id", "r2")),
    (1, "records[1].round", lambda r: setattr(r, "round", -1)),
    (2, "records[2].verified", lambda r: (setattr(r, "verified", True),
                                         setattr(r, "finish_reason", pb.FINISH_REASON_LENGTH))),
    (3, "records[3].token_ids", lambda r: [r.ClearField(f) for f in (
        "token_ids", "offset_starts", "offset_ends", "logprobs")]),
    (0, "records[0].kind", lambda r: setattr(r, "kind", 9)),
    (1, "records[1].finish_reason", lambda r: setattr(r, "finish_reason", 7)),
    (2, "records[2].text", lambda r: setattr(r, "text", "x" * (LIM.max_text_chars + 1))),
    (3, "records[3].meta", lambda r: r.meta.update({f"k{i}": "v" for i in range(40)})),
    (0, "records[0].meta['k']", lambda r: r.meta.update({"k": "v" * (LIM.max_meta_chars + 1)})),
])
def test_every_rejection_is_named_by_the_reference(idx: int, field: str, change: Change) -> None:
    recs = [rollout("a", 0, "p", i, n_tokens=40) for i in range(4)]
    body = _body(recs)
    assert _fast(body) == [True] * 4
    hp.accept_records(body, hp.scan_request(body, LIM), RUN, LIM)  # valid as generated
    change(recs[idx])
    body = _body(recs)
    assert _fast(body)[idx] is False or field.endswith(("policy_id", "run_id"))
    with pytest.raises(InvalidArgument) as err:
        hp.accept_records(body, hp.scan_request(body, LIM), RUN, LIM)
    assert str(err.value).startswith(field)


def test_malformed_and_oversized_requests() -> None:
    with pytest.raises(hp.MalformedRequest):
        hp.scan_request(b"\x12\x05abc", LIM)
    with pytest.raises(hp.MalformedRequest):
        hp.scan_request(b"\x12", LIM)
    small = SeeLimits(max_batch_records=2)
    with pytest.raises(hp.TooManyRecords):
        hp.scan_request(_body([rollout("a", 0, "p", i) for i in range(3)]), small)
    assert hp.scan_request(b"", LIM).rows == []
    # An unknown request field holding a negative varint (10 bytes) is legal protobuf.
    body = _body([rollout("a", 0, "p", 0)]) + b"\x18" + encode_varint(-5)
    assert pb.PublishRequest.FromString(body).run_id == "r1"
    assert _fast(body) == [True]


_IDS = st.sampled_from(["", "a/1", "p", "x|y", "t\x01", "é", "a" * 300, "r1", "r2"])
_EDGES = st.sampled_from([0.0, -0.0, -1.5, math.nan, math.inf, -math.inf])
_F32 = st.one_of(_EDGES, st.floats(width=32, allow_nan=True, allow_infinity=True))


@st.composite
def _records(draw: st.DrawFn) -> pb.ExperienceRecord:
    """A valid rollout whose fields are each, with probability 1/6, pushed across (or up to)
    a rule's boundary: most records are valid or one rule away from it."""
    n = draw(st.integers(1, 8))
    text = draw(st.one_of(st.text("ab ;1", min_size=n, max_size=12), st.text(max_size=6)))
    rec = rollout("a", 0, "p", 0, n_tokens=n)
    rec.text = text
    for i in range(n):
        rec.offset_starts[i] = min(i, len(text))
        rec.offset_ends[i] = min(i + 1, len(text))

    def edge() -> bool:
        return draw(st.integers(0, 5)) == 0

    for name in ("record_id", "prompt_id", "tokenizer_id"):
        if edge():
            setattr(rec, name, draw(_IDS))
    if edge():
        rec.run_id = draw(st.sampled_from(["", "r1", "r2"]))
    if edge():
        rec.policy_id = draw(st.sampled_from(["a", "b", "c"]))
    for name in ("policy_version", "round"):
        if edge():
            setattr(rec, name, draw(st.integers(-3, 2**62)))
    if edge():
        rec.kind = draw(st.sampled_from([0, 2, 3, 5]))
    if edge():
        rec.finish_reason = draw(st.sampled_from([0, 1, 2, 3, 6]))
    if edge():
        rec.verified = True
    if edge():
        rec.reward = draw(st.one_of(_EDGES, st.floats(allow_nan=True, allow_infinity=True)))
    if edge():
        rec.meta.update(draw(st.dictionaries(st.text(max_size=3), st.text(max_size=3),
                                             max_size=3)))
    if edge():
        rec.prompt_text = draw(st.text(max_size=5))
    values = {"token_ids": st.integers(-2, 2**31 - 1),
              "offset_starts": st.integers(-1, len(text) + 1),
              "offset_ends": st.integers(-1, len(text) + 1), "logprobs": _F32}
    for name, strategy in values.items():
        field = getattr(rec, name)
        if edge():
            field[draw(st.integers(0, n - 1))] = draw(strategy)
        if draw(st.integers(0, 15)) == 0:
            if draw(st.booleans()):
                field.append(draw(strategy))
            else:
                field.pop()
    return rec


def _reference_accepts(raw: bytes, i: int) -> bool:
    try:
        rec = pb.ExperienceRecord.FromString(raw)
        validate_record(rec, i, RUN, frozenset(RUN.policies), LIM, len(raw))
    except (InvalidArgument, DecodeError):
        return False
    return True


def _check_sound(body: bytes) -> None:
    try:
        scan = hp.scan_request(body, LIM)
    except hp.MalformedRequest:
        return
    for i, row in enumerate(scan.rows):
        if not hp.fast_accepted(body, row, frozenset({b"a", b"b"}), b"r1"):
            continue
        raw = body[row[hp.C_START]:row[hp.C_END]]
        assert _reference_accepts(raw, i), f"fast path accepted an invalid record: {raw!r}"
        rec = pb.ExperienceRecord.FromString(raw)
        assert body[row[hp.C_RID_S]:row[hp.C_RID_E]].decode() == rec.record_id
        assert body[row[hp.C_POL_S]:row[hp.C_POL_E]].decode() == rec.policy_id
        assert body[row[hp.C_PROMPT_S]:row[hp.C_PROMPT_E]].decode() == rec.prompt_id
        assert (row[hp.C_ROUND], row[hp.C_VERSION], row[hp.C_KIND]) == (
            rec.round, rec.policy_version, rec.kind)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_records(), min_size=1, max_size=3))
def test_fast_path_is_sound_on_random_records(recs: list[pb.ExperienceRecord]) -> None:
    _check_sound(_body(recs))


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 255), st.sampled_from(["flip", "insert", "cut"]))
def test_fast_path_is_sound_on_corrupted_bytes(where: int, byte: int, how: str) -> None:
    body = bytearray(_body([rollout("a", 0, "p", i, n_tokens=12) for i in range(2)]))
    k = where % len(body)
    if how == "flip":
        body[k] = byte
    elif how == "insert":
        body.insert(k, byte)
    else:
        del body[k:k + 1 + byte % 8]
    _check_sound(bytes(body))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 400), st.text("abc 0123456789;+=", min_size=1, max_size=300),
       st.integers(0, 2**28 - 1), st.integers(0, 2**62))
def test_valid_ascii_rollouts_take_the_fast_path(n: int, text: str, tok: int, rnd: int) -> None:
    rec = rollout("b", 0, "p", 0, n_tokens=n)
    rec.text = text
    rec.round = rnd
    rec.token_ids[n // 2] = tok
    for i in range(n):
        rec.offset_starts[i] = min(i, len(text))
        rec.offset_ends[i] = min(i + 1, len(text))
    assert _fast(_body([rec])) == [True]
