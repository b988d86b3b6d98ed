"""SEE's wire-format helpers agree with protobuf itself; the batch array checks name records."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mutualrl.common.errors import InvalidArgument
from mutualrl.see import wire
from mutualrl.see.config import SeeConfig, SeeLimits
from mutualrl.see.keys import RunKeys
from mutualrl.see.store import Header, pack_command
from mutualrl.see.testing import rollout, stats_record
from mutualrl.see.validate import ArrayBatch, normalise_text, text_digest, validate_record
from mutualrl.v1 import experience_pb2 as pb

RUN = pb.RunConfig(run_id="r1", policies=["a", "b"], tau=1.0)
POL = frozenset(RUN.policies)
LIM = SeeLimits()


def test_split_publish_request_matches_protobuf() -> None:
    recs = [rollout("a", 1, f"p{i}", i, n_tokens=5 + i) for i in range(4)]
    body = pb.PublishRequest(run_id="r1", records=recs).SerializeToString()
    run_id, raws = wire.split_publish_request(body)
    assert run_id == "r1"
    assert [pb.ExperienceRecord.FromString(b) for b in raws] == recs
    assert wire.split_publish_request(b"") == ("", [])
    with pytest.raises(wire.WireError):
        wire.split_publish_request(b"\x12\x05abc")


def test_stamp_sets_run_and_created_without_reserializing() -> None:
    rec = rollout("a", 0, "p", 0)
    rec.run_id = "someone-else"
    stamped = wire.stamp(rec.SerializeToString(), wire.string_field(2, "r1"), 1_700_000_000_123)
    back = pb.ExperienceRecord.FromString(stamped)
    assert back.run_id == "r1" and back.created_unix_ms == 1_700_000_000_123
    assert list(back.token_ids) == list(rec.token_ids) and back.text == rec.text


@pytest.mark.parametrize("values", [[0, 1, 127], [128, 300, 16383, 16384, 2**31 - 1], [], [5]])
def test_decode_packed_varints(values: list[int]) -> None:
    buf = pb.ExperienceRecord(token_ids=values).SerializeToString()
    ranges = wire.packed_ranges(buf)
    if not values:
        assert ranges == {}
        return
    assert ranges is not None
    got = wire.decode_packed_varints(buf, *ranges[wire.F_TOKEN_IDS])
    assert got is not None and got.tolist() == values
    neg = pb.ExperienceRecord(token_ids=[*values, -1]).SerializeToString()
    r2 = wire.packed_ranges(neg)
    assert r2 is not None
    assert wire.decode_packed_varints(neg, *r2[wire.F_TOKEN_IDS]) is None


def test_packed_ranges_fast_agrees_with_the_walk() -> None:
    for rec in (rollout("a", 0, "p", 0), rollout("b", 2**33, "ü-prompt", 7, n_tokens=300)):
        rec.text = rec.text + " é"  # non-ASCII text: byte and character lengths differ
        rec.offset_ends[-1] = len(rec.text)
        buf = rec.SerializeToString()
        assert wire.packed_ranges_fast(buf, rec) == wire.packed_ranges(buf)


def test_publish_response_bytes_parse() -> None:
    body = wire.publish_response([b"x/1", b"y"], "10")
    resp = pb.PublishResponse.FromString(body)
    assert [(r.record_id, r.status) for r in resp.results] == [
        ("x/1", pb.PUBLISH_STATUS_STORED), ("y", pb.PUBLISH_STATUS_DUPLICATE)]
    assert (resp.stored, resp.duplicates) == (1, 1)


def test_pack_command_is_resp() -> None:
    assert pack_command(("SET", "k", b"\x00v", 12)) == (
        b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\n\x00v\r\n$2\r\n12\r\n")


def test_header_round_trip_and_keys() -> None:
    h = Header.of({b"h": "\x1f".join(("a/1", "a", "p0", "3", "1", "7")).encode()})
    assert (h.record_id, h.policy_id, h.prompt_id, h.round, h.verified, h.policy_version) == (
        "a/1", "a", "p0", 3, True, 7)
    k = RunKeys("mrl", "run-1")
    # Every key of a run shares one hash tag: one cluster slot.
    assert all(key.startswith("mrl:{run-1}:") for key in k.fixed())
    assert k.round_stats(4) == "mrl:{run-1}:rs:4"


def test_text_normalisation() -> None:
    assert normalise_text("  x   =\n\t2 ") == "x = 2"
    assert text_digest("x = 2") == text_digest(" x =  2\n")
    assert text_digest("x = 2") != text_digest("x = 3")


def _batch(recs: list[pb.ExperienceRecord]) -> None:
    arrays = ArrayBatch()
    for i, rec in enumerate(recs):
        validate_record(rec, i, RUN, POL, LIM, rec.SerializeToString(), arrays)
    arrays.check()


@pytest.mark.parametrize(("idx", "field", "change"), [
    (2, "records[2].offset_ends", lambda r: r.offset_ends.__setitem__(3, 99_999)),
    (1, "records[1].offset_starts", lambda r: r.offset_starts.__setitem__(0, len(r.text) + 1)),
    (0, "records[0].offset_ends", lambda r: r.offset_ends.__setitem__(5, r.offset_starts[5] - 1)),
    (3, "records[3].logprobs", lambda r: r.logprobs.__setitem__(9, math.inf)),
    (1, "records[1].token_ids", lambda r: r.token_ids.__setitem__(9, -3)),
    (2, "records[2].offset_starts", lambda r: r.offset_starts.__setitem__(9, -3)),
])
def test_batch_array_checks_name_the_record(idx: int, field: str, change: object) -> None:
    recs = [rollout("a", 0, "p", i, n_tokens=40) for i in range(4)]
    _batch(recs)  # valid as generated
    change(recs[idx])  # type: ignore[operator]
    with pytest.raises(InvalidArgument) as err:
        _batch(recs)
    assert str(err.value).startswith(field)


def test_token_id_536870911_is_not_mistaken_for_negative() -> None:
    rec = rollout("a", 0, "p", 0, n_tokens=10)
    rec.token_ids[4] = 2**29 - 1  # its varint ends like a negative int32's
    _batch([rec])


def test_unpacked_arrays_take_the_slow_path() -> None:
    rec = rollout("a", 0, "p", 0, n_tokens=3)
    # Hand-written unpacked encoding of token_ids (field 11, wire type 0 per element).
    base = pb.ExperienceRecord()
    base.CopyFrom(rec)
    base.ClearField("token_ids")
    raw = base.SerializeToString() + b"".join(b"\x58" + wire.encode_varint(t)
                                              for t in rec.token_ids)
    parsed = pb.ExperienceRecord.FromString(raw)
    assert list(parsed.token_ids) == list(rec.token_ids)
    assert wire.packed_ranges(raw) is None
    arrays = ArrayBatch()
    validate_record(parsed, 0, RUN, POL, LIM, raw, arrays)
    arrays.check()
    assert arrays.fields == []  # checked on its own, not queued


def test_stats_rules_and_config_defaults() -> None:
    ok = stats_record("a", 0, "p", [1.0, 0.0, 0.5])
    validate_record(ok, 0, RUN, POL, LIM)
    ok.stats.max = 0.1  # below the mean
    with pytest.raises(InvalidArgument, match=r"records\[0\].stats.max"):
        validate_record(ok, 0, RUN, POL, LIM)
    cfg = SeeConfig()
    assert (cfg.port, cfg.rest_port) == (50051, 8080)
    assert cfg.limits.max_batch_records == 4096
    assert np.isfinite(cfg.retention.max_stream_len)
    # Every field documented (the config rule of CONTRIBUTING.md).
    for model in (SeeConfig, SeeLimits):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
