"""Bad input gets INVALID_ARGUMENT / NOT_FOUND naming the field, and the server keeps serving;
random records thrown at Publish never produce INTERNAL/UNKNOWN."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mutualrl.bench.testing.see import make_config, rollout, stats_record, success_record
from mutualrl.client.see import ClientOptions, SeeClient
from mutualrl.common import token_arrays as ta
from mutualrl.see.validate import MAX_TTL_SECONDS
from mutualrl.v1 import experience_pb2 as pb

INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def see_sync(redis_url: str) -> Iterator[Any]:
    """One SEE for the module, run in a background thread's event loop (hypothesis drives a
    blocking client)."""
    import asyncio
    import os
    import threading

    from mutualrl.see.server import start_see

    token = os.environ.pop("MUTUALRL_AUTH_TOKEN", None)
    loop = asyncio.new_event_loop()
    started: dict[str, Any] = {}
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        started["see"] = loop.run_until_complete(start_see(make_config(redis_url)))
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(20)
    see = started["see"]
    try:
        yield see
    finally:
        asyncio.run_coroutine_threadsafe(see.stop(0.2), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        if token is not None:
            os.environ["MUTUALRL_AUTH_TOKEN"] = token


@pytest.fixture
def c(see_sync: Any) -> Iterator[SeeClient]:
    with SeeClient(ClientOptions(address=see_sync.address, outage_budget=0, timeout=10)) as client:
        yield client


def expect(code: grpc.StatusCode, field: str, fn: Callable[[], Any]) -> str:
    with pytest.raises(grpc.RpcError) as err:
        fn()
    assert err.value.code() == code, err.value.details()
    assert field in err.value.details(), err.value.details()
    return str(err.value.details())


def mutated(base: pb.ExperienceRecord, change: Callable[[pb.ExperienceRecord], Any]
            ) -> pb.ExperienceRecord:
    rec = pb.ExperienceRecord()
    rec.CopyFrom(base)
    change(rec)
    return rec


def set_at(rec: pb.ExperienceRecord, field: str, i: int, value: float) -> None:
    """Change element `i` of one of the record's packed per-token arrays."""
    dtype = ta.F32 if field == "logprobs_f32" else ta.I32
    arr = np.frombuffer(getattr(rec, field), dtype=dtype).copy()
    arr[i] = value
    setattr(rec, field, arr.tobytes())


BAD_RECORDS: list[tuple[str, Callable[[pb.ExperienceRecord], Any], str]] = [
    ("nan reward", lambda r: setattr(r, "reward", math.nan), "records[1].reward"),
    ("inf reward", lambda r: setattr(r, "reward", math.inf), "records[1].reward"),
    ("no id", lambda r: setattr(r, "record_id", ""), "records[1].record_id"),
    ("id with |", lambda r: setattr(r, "record_id", "a|b"), "records[1].record_id"),
    ("unknown policy", lambda r: setattr(r, "policy_id", "zz"), "records[1].policy_id"),
    ("no kind", lambda r: setattr(r, "kind", pb.RECORD_KIND_UNSPECIFIED), "records[1].kind"),
    ("unknown kind", lambda r: setattr(r, "kind", 9), "records[1].kind"),
    ("negative round", lambda r: setattr(r, "round", -1), "records[1].round"),
    ("no prompt", lambda r: setattr(r, "prompt_id", ""), "records[1].prompt_id"),
    ("short offsets", lambda r: setattr(r, "offset_ends_i32", r.offset_ends_i32[:-4]),
     "records[1].offset_ends_i32"),
    ("long logprobs", lambda r: setattr(r, "logprobs_f32", r.logprobs_f32 + ta.pack_f32([-1])),
     "records[1].logprobs_f32"),
    ("ragged token bytes", lambda r: setattr(r, "token_ids_i32", r.token_ids_i32 + b"\0"),
     "records[1].token_ids_i32"),
    ("nan logprob", lambda r: set_at(r, "logprobs_f32", 3, math.nan), "records[1].logprobs_f32"),
    ("negative token", lambda r: set_at(r, "token_ids_i32", 2, -7), "records[1].token_ids_i32"),
    ("offset past text", lambda r: set_at(r, "offset_ends_i32", 4, 10_000),
     "records[1].offset_ends_i32"),
    ("negative start", lambda r: set_at(r, "offset_starts_i32", 0, -1),
     "records[1].offset_starts_i32"),
    ("end before start", lambda r: set_at(r, "offset_ends_i32", 4,
                                          int(ta.offset_starts(r)[4]) - 1),
     "records[1].offset_ends_i32"),
    ("other run", lambda r: setattr(r, "run_id", "other-run"), "records[1].run_id"),
    ("no tokens", lambda r: (r.ClearField("token_ids_i32"), r.ClearField("offset_starts_i32"),
                             r.ClearField("offset_ends_i32"), r.ClearField("logprobs_f32")),
     "records[1].token_ids_i32"),
    ("verified but truncated", lambda r: (setattr(r, "verified", True),
                                          setattr(r, "finish_reason", pb.FINISH_REASON_LENGTH)),
     "records[1].verified"),
    ("oversize text", lambda r: setattr(r, "text", "x" * 300_000), "records[1].text"),
    ("too much meta", lambda r: r.meta.update({f"k{i}": "v" for i in range(40)}),
     "records[1].meta"),
]


def test_contract_v1_arrays_are_refused_naming_the_change(c: SeeClient, run_id: str) -> None:
    """A writer still on contract version 1 (repeated arrays in fields 11-14) is told so."""
    c.create_run(run_id, ["a", "b"], tau=1.0, exist_ok=True)
    rec = rollout("a", 0, "p1", 0)
    for f in ("token_ids_i32", "offset_starts_i32", "offset_ends_i32", "logprobs_f32"):
        rec.ClearField(f)
    # Field 11 (v1 token_ids), packed varints 5, 6, 7: an unknown field for contract v2.
    old = pb.ExperienceRecord.FromString(rec.SerializeToString() + b"\x5a\x03\x05\x06\x07")
    msg = expect(INVALID, "records[0].token_ids_i32", lambda: c.publish(run_id, [old]))
    assert "contract version 1" in msg, msg


@pytest.mark.parametrize(("name", "change", "field"), BAD_RECORDS, ids=[b[0] for b in BAD_RECORDS])
def test_bad_record_is_refused_naming_the_field(c: SeeClient, run_id: str, name: str,
                                                change: Callable[[pb.ExperienceRecord], Any],
                                                field: str) -> None:
    c.create_run(run_id, ["a", "b"], tau=1.0, exist_ok=True)
    good = rollout("a", 0, "p0", 0)
    bad = mutated(rollout("a", 0, "p1", 0), change)
    expect(INVALID, field, lambda: c.publish(run_id, [good, bad]))
    # The batch is all-or-nothing: the good record was not stored either; the server serves.
    assert c.publish(run_id, [good]).stored == 1


def test_kind_specific_rules(c: SeeClient, run_id: str) -> None:
    c.create_run(run_id, ["a", "b"], tau=0.8)
    ok = success_record("a", 0, "p0", "x = 1", reward=0.8)
    cases = [
        (mutated(ok, lambda r: setattr(r, "verified", False)), "records[0].verified"),
        (mutated(ok, lambda r: setattr(r, "reward", 0.5)), "records[0].reward"),
        (mutated(ok, lambda r: setattr(r, "finish_reason", pb.FINISH_REASON_UNSPECIFIED)),
         "records[0].finish_reason"),
        (mutated(ok, lambda r: setattr(r, "text", "   ")), "records[0].text"),
        (mutated(stats_record("a", 0, "p0", [1.0]), lambda r: r.ClearField("stats")),
         "records[0].stats"),
        (mutated(stats_record("a", 0, "p0", [1.0]), lambda r: setattr(r.stats, "count", 0)),
         "records[0].stats.count"),
        (mutated(stats_record("a", 0, "p0", [1.0, 0.0]),
                 lambda r: setattr(r.stats, "sum_sq", 0.1)), "records[0].stats.sum_sq"),
        (mutated(stats_record("a", 0, "p0", [1.0]), lambda r: setattr(r.stats, "max", math.nan)),
         "records[0].stats.max"),
    ]
    for rec, field in cases:
        expect(INVALID, field, lambda rec=rec: c.publish(run_id, [rec]))
        assert c.publish(run_id, [ok]).results[0].status in (pb.PUBLISH_STATUS_STORED,
                                                             pb.PUBLISH_STATUS_DUPLICATE)


def test_stream_ids_beyond_64_bits_are_invalid_argument(c: SeeClient, run_id: str) -> None:
    """#14 item 2: a part above 2^64-1 passed the id check, then Redis refused it (INTERNAL)."""
    c.create_run(run_id, ["a", "b"], tau=1.0, exist_ok=True)
    for bad in (f"{2**64}-0", f"0-{2**64}", "99999999999999999999-1"):
        msg = expect(INVALID, "delivery_ids[0]", lambda bad=bad: c.ack(run_id, "a", [bad]))
        assert "2^64-1" in msg, msg
        expect(INVALID, "after_id",
               lambda bad=bad: next(iter(c.subscribe(run_id, after_id=bad))))
    top = f"{2**64 - 1}-{2**64 - 1}"
    assert c.ack(run_id, "a", [top]) == 0  # the largest id Redis takes is still accepted


def test_retention_beyond_its_bounds_is_invalid_argument(c: SeeClient, run_id: str) -> None:
    """#14 item 3: ttl_seconds = 2^63-1 reached Redis (invalid expire time: INTERNAL)."""
    for name in ("ttl_seconds", "max_stream_len", "max_rounds"):
        ret = pb.Retention(**{name: 2**63 - 1})
        msg = expect(INVALID, f"config.retention.{name}", lambda ret=ret: c._call(
            c.stub.CreateRun, pb.CreateRunRequest(config=pb.RunConfig(
                run_id=run_id, policies=["a"], tau=1.0, retention=ret))))
        assert "largest allowed" in msg, msg
    ok = pb.RunConfig(run_id=run_id, policies=["a"], tau=1.0,
                      retention=pb.Retention(ttl_seconds=MAX_TTL_SECONDS))
    run = c._call(c.stub.CreateRun, pb.CreateRunRequest(config=ok))
    assert run.config.retention.ttl_seconds == MAX_TTL_SECONDS


def test_bad_requests_on_every_rpc(c: SeeClient, run_id: str) -> None:
    c.create_run(run_id, ["a", "b"], tau=1.0)
    nf = grpc.StatusCode.NOT_FOUND
    expect(nf, "run_id", lambda: c.publish("no-such-run", [rollout("a", 0, "p", 0)]))
    expect(nf, "run_id", lambda: c.get_run("no-such-run"))
    expect(nf, "run_id", lambda: c.fetch_rollouts("no-such-run", "a", "x"))
    expect(nf, "run_id", lambda: c.run_stats("no-such-run"))
    expect(nf, "run_id", lambda: c.round_stats("no-such-run", 0, ["p"]))
    expect(nf, "run_id", lambda: c.successes("no-such-run", "a", ["p"]))
    expect(INVALID, "run_id", lambda: c.get_run("bad run id!"))
    expect(nf, "run_id", lambda: c.delete_run("no-such-run"))
    expect(INVALID, "run_id", lambda: c.delete_run("bad run id!"))
    expect(INVALID, "config.policies", lambda: c.create_run("fresh-" + run_id, [], tau=1.0))
    expect(INVALID, "config.policies[1]", lambda: c.create_run("fresh-" + run_id, ["a", "a"]))
    expect(INVALID, "config.tau", lambda: c.create_run("fresh-" + run_id, ["a"], tau=math.nan))
    expect(INVALID, "policy_id", lambda: c.fetch_rollouts(run_id, "zz", "x"))
    expect(INVALID, "consumer", lambda: c.fetch_rollouts(run_id, "a", ""))
    expect(INVALID, "max_records", lambda: c.fetch_rollouts(run_id, "a", "x", max_records=0))
    expect(INVALID, "block_ms", lambda: c.fetch_rollouts(run_id, "a", "x", block_ms=999_999))
    expect(INVALID, "delivery_ids[0]", lambda: c.ack(run_id, "a", ["garbage"]))
    expect(INVALID, "prompt_ids", lambda: c.round_stats(run_id, 0, []))
    expect(INVALID, "wait_ms", lambda: c.round_stats(run_id, 0, ["p"], wait_ms=100_000))
    expect(INVALID, "expect_policies[0]",
           lambda: c.round_stats(run_id, 0, ["p"], expect_policies=["zz"]))
    expect(INVALID, "round", lambda: c.round_stats(run_id, -1, ["p"]))
    expect(INVALID, "prompt_ids[0]", lambda: c.successes(run_id, "a", [""]))
    expect(INVALID, "after_id", lambda: next(iter(c.subscribe(run_id, after_id="x"))))
    expect(INVALID, "records", lambda: c._call(
        c.stub.Publish, pb.PublishRequest(run_id=run_id, records=[rollout("a", 0, "p", i)
                                                             for i in range(4097)])))
    # Bytes that are not a PublishRequest at all.
    raw = c.channel.unary_unary("/mutualrl.v1.ExperienceExchange/Publish")
    expect(INVALID, "records", lambda: raw(b"\x12\xff\xff\xff\x0f", timeout=5))
    head = pb.PublishRequest(run_id=run_id).SerializeToString()
    expect(INVALID, "records", lambda: raw(head + b"\x12\x03\xff\xff\xff", timeout=5))
    # Still serving.
    assert c.publish(run_id, [rollout("a", 0, "p", 0)]).stored == 1
    assert c.get_run(run_id).config.run_id == run_id


def test_oversize_record_and_message(see_sync: Any, c: SeeClient, run_id: str) -> None:
    c.create_run(run_id, ["a", "b"], tau=1.0)
    big = rollout("a", 0, "p0", 0, n_tokens=40_000)  # ~600 kB serialized, 1 MiB limit
    assert c.publish(run_id, [big]).stored == 1
    huge = rollout("a", 0, "p1", 0, n_tokens=65_000)
    huge.prompt_text = "y" * 250_000
    expect(INVALID, "records[0]", lambda: c.publish(run_id, [huge]))
    assert c.publish(run_id, [rollout("a", 0, "p2", 0)]).stored == 1


# --------------------------------------------------------------------------- hypothesis

_finite = st.floats(allow_nan=True, allow_infinity=True, width=64)
_ids = st.text(min_size=0, max_size=12)


@st.composite
def random_record(draw: st.DrawFn) -> pb.ExperienceRecord:
    n = draw(st.integers(0, 6))
    m = draw(st.sampled_from([n, n, n, max(0, n - 1), n + 1]))
    rec = pb.ExperienceRecord(
        record_id=draw(_ids), policy_id=draw(st.sampled_from(["a", "b", "", "zz"])),
        policy_version=draw(st.integers(-3, 2**40)), round=draw(st.integers(-3, 2**40)),
        prompt_id=draw(_ids), kind=draw(st.integers(0, 4)),
        text=draw(st.text(max_size=20)), prompt_text=draw(st.text(max_size=10)),
        tokenizer_id=draw(_ids),
        token_ids_i32=ta.pack_i32(draw(st.lists(st.integers(-2**31, 2**31 - 1), min_size=n,
                                                max_size=n))),
        offset_starts_i32=ta.pack_i32(draw(st.lists(st.integers(-2**31, 2**31 - 1), min_size=m,
                                                    max_size=m))),
        offset_ends_i32=ta.pack_i32(draw(st.lists(st.integers(-5, 25), min_size=n,
                                                  max_size=n))) + draw(st.sampled_from(
                                                      [b"", b"", b"", b"\1"])),
        logprobs_f32=ta.pack_f32(draw(st.lists(st.floats(width=32), min_size=n, max_size=n))),
        reward=draw(_finite), verified=draw(st.booleans()),
        finish_reason=draw(st.integers(0, 4)),
        meta=draw(st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3)))
    if draw(st.booleans()):
        rec.stats.CopyFrom(pb.RewardStats(count=draw(st.integers(-1, 5)), sum=draw(_finite),
                                          sum_sq=draw(_finite), max=draw(_finite)))
    return rec


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(records=st.lists(random_record(), min_size=1, max_size=4))
def test_random_records_never_break_publish(c: SeeClient, run_id: str,
                                            records: list[pb.ExperienceRecord]) -> None:
    c.create_run(run_id, ["a", "b"], tau=0.5, exist_ok=True)
    try:
        resp = c.publish(run_id, records)
        assert len(resp.results) == len(records)
    except grpc.RpcError as err:
        assert err.code() == INVALID, (err.code(), err.details())
        assert err.details().startswith("records"), err.details()
    # The server still answers.
    assert c.get_run(run_id).config.run_id == run_id
