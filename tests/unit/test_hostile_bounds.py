"""The numbers clients send, held to what the arithmetic downstream can hold
(`mutualrl.common.bounds`), over the extremes: REWARD_STATS counts and sums that pass can be
pooled over a run's 256 policies without overflow (also in float32, where trainers compute
advantages); rounds beyond the horizon or 2^31 - 1 are refused naming the field; stored stats
that break the rules are left out of a pool instead of failing it; what a message quotes of a
caller's string is bounded; page tokens are refused unless they are this request's."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mutualrl.common import bounds
from mutualrl.common.errors import (
    MAX_FIELD_CHARS,
    MAX_MESSAGE_CHARS,
    MAX_QUOTED_CHARS,
    InvalidArgument,
    quote,
)
from mutualrl.common.records import check_stats, validate_records
from mutualrl.see.config import SeeLimits
from mutualrl.see.store.paging import Budget, make_token, read_index, read_token, request_digest
from mutualrl.see.store.roundstats import parse_stats, pool
from mutualrl.v1 import experience_pb2 as pb

EXTREME_INTS = (0, 1, -1, 2**20, 2**20 + 1, 2**31 - 1, 2**31, 2**53, 2**63 - 1, -(2**63))
EXTREME_FLOATS = (0.0, -0.0, 1.0, -1.0, 1e9, 1e9 + 1e3, -1e9, 1e18, 1e150, 1e300, 1.7e308,
                  -1.7e308, math.inf, -math.inf, math.nan, 5e-324)
ints = st.one_of(st.sampled_from(EXTREME_INTS), st.integers(-(2**63), 2**63 - 1))
floats = st.one_of(st.sampled_from(EXTREME_FLOATS), st.floats(allow_nan=True))
RUN = pb.RunConfig(run_id="r", policies=["a", "b"], tau=0.5)


@settings(max_examples=400, deadline=None)
@given(entries=st.lists(st.tuples(ints, floats, floats, floats), min_size=1, max_size=256))
def test_stats_that_pass_pool_without_overflow(
        entries: list[tuple[int, float, float, float]]) -> None:
    accepted = []
    for count, total, sum_sq, top in entries:
        try:
            check_stats(count, total, sum_sq, top, "records[0].stats")
        except InvalidArgument as err:
            assert err.field.startswith("records[0].stats."), err.field
            continue
        accepted.append(pb.RewardStats(count=count, sum=total, sum_sq=sum_sq, max=top))
    pooled = pool(accepted)
    assert pooled.count < 2**63 and pooled.count <= 256 * bounds.MAX_GROUP_SIZE
    for value in (pooled.sum, pooled.sum_sq, pooled.max):
        assert math.isfinite(value)
    # What a trainer does with them, in float32: still finite.
    with np.errstate(over="raise", invalid="raise"):
        f32 = np.array([(e.sum, e.sum_sq) for e in accepted] or [(0.0, 0.0)], dtype=np.float32)
        assert np.isfinite(f32.sum(axis=0)).all()


@settings(max_examples=300, deadline=None)
@given(count=ints, total=floats, sum_sq=floats, top=floats)
def test_a_hostile_reward_stats_record_is_refused_naming_the_field(
        count: int, total: float, sum_sq: float, top: float) -> None:
    try:
        rec = pb.ExperienceRecord(record_id="x", policy_id="a", prompt_id="q", round=0,
                                  kind=pb.REWARD_STATS, stats=pb.RewardStats(
                                      count=count, sum=total, sum_sq=sum_sq, max=top))
    except ValueError:
        return  # not representable on the wire (a count past int64)
    try:
        validate_records([rec], RUN, SeeLimits())
    except InvalidArgument as err:
        assert err.field.startswith("records[0].stats."), err
        return
    assert 1 <= count <= bounds.MAX_GROUP_SIZE
    assert abs(top) <= bounds.MAX_ABS_REWARD


def test_the_issue_record_is_refused_and_a_stored_one_is_left_out() -> None:
    """count = 2^63 - 1 once passed; stored by an older SEE, it must not fail the pool."""
    rec = pb.ExperienceRecord(record_id="x", policy_id="a", prompt_id="q", round=0,
                              kind=pb.REWARD_STATS,
                              stats=pb.RewardStats(count=2**63 - 1, sum=1.0, sum_sq=1.0, max=1.0))
    with pytest.raises(InvalidArgument) as err:
        validate_records([rec], RUN, SeeLimits())
    assert err.value.field == "records[0].stats.count"
    stored = [f"{2**63 - 1},1.0,1.0,1.0", "8,4.0,4.0,1.0", "1e400,1,1,1", "x,y", "",
              f"{2**70},0,0,0", "1,nan,0,0", "1,1e300,1e300,1e300", "1,-1,1,-1"]
    parsed = [parse_stats(raw) for raw in stored]
    assert [p is not None for p in parsed] == [False, True, False, False, False, False, False,
                                               False, True]
    pooled = pool([p for p in parsed if p is not None])
    assert (pooled.count, pooled.sum, pooled.sum_sq, pooled.max) == (9, 3.0, 5.0, 1.0)


@settings(max_examples=300, deadline=None)
@given(value=ints, current=st.one_of(st.none(), st.integers(0, bounds.MAX_ROUND)),
       ahead=st.integers(1, 10_000))
def test_rounds_are_held_to_the_horizon_and_to_2_31(value: int, current: int | None,
                                                   ahead: int) -> None:
    try:
        got = bounds.check_round(value, "round", current, ahead)
    except InvalidArgument as err:
        assert err.field == "round"
        assert (value < 0 or value > bounds.MAX_ROUND
                or (current is not None and value > current + ahead))
        return
    assert got == value and 0 <= value <= bounds.MAX_ROUND
    assert current is None or value <= current + ahead
    # Exact where rounds go: Redis scores and Lua numbers are doubles.
    assert int(float(value)) == value


@given(rounds=st.lists(ints, min_size=1, max_size=20))
def test_a_record_round_past_2_31_is_refused_naming_its_record(rounds: list[int]) -> None:
    recs = []
    for i, r in enumerate(rounds):
        recs.append(pb.ExperienceRecord(record_id=f"x{i}", policy_id="a", prompt_id="q",
                                        round=r, kind=pb.REWARD_STATS,
                                        stats=pb.RewardStats(count=1, sum=1, sum_sq=1, max=1)))
    bad = [i for i, r in enumerate(rounds) if not 0 <= r <= bounds.MAX_ROUND]
    if not bad:
        validate_records(recs, RUN, SeeLimits())
        return
    with pytest.raises(InvalidArgument) as err:
        validate_records(recs, RUN, SeeLimits())
    assert err.value.field == f"records[{bad[0]}].round"


@given(text=st.one_of(st.text(max_size=200), st.integers(0, 2_000_000).map(lambda n: "x" * n)))
def test_a_message_quotes_a_bounded_prefix_of_what_it_was_sent(text: str) -> None:
    q = quote(text)
    assert len(q) <= MAX_QUOTED_CHARS * 4 + 40  # repr escapes at most 4 characters a character
    if len(text) > MAX_QUOTED_CHARS:
        assert f"({len(text)} characters)" in q
    err = InvalidArgument("x" * (10 * MAX_FIELD_CHARS), text * 10)
    assert len(err.field) <= MAX_FIELD_CHARS + 40
    assert len(err.message) <= MAX_MESSAGE_CHARS + 40


@given(position=st.text(max_size=300), other=st.text(max_size=300))
def test_page_tokens_are_bound_to_their_request(position: str, other: str) -> None:
    digest = request_digest("run", 3, ["p0", "p1"])
    assert read_token(make_token(digest, position), digest) == position
    if other:
        with pytest.raises(InvalidArgument) as err:
            read_token(other, digest)
        assert err.value.field == "page_token"
    assert read_token("", digest) is None
    with pytest.raises(InvalidArgument):
        read_token(make_token(request_digest("run", 4, ["p0", "p1"]), position), digest)
    with pytest.raises(InvalidArgument):
        read_index(make_token(digest, position if not position.isdigit() else "-1"), digest, 5)


def test_a_page_holds_its_first_entry_and_then_what_fits() -> None:
    room = Budget(100)
    assert room.take(500)  # the first entry, whatever its size
    assert not room.take(1)
    room = Budget(100)
    assert room.take(60) and room.take(40) and not room.take(1)
