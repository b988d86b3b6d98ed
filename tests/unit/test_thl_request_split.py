"""THL reads an AlignTrace request's items one at a time from its bytes
(`servicer._split_items`): split and parsed piecewise, any request reads exactly as the
generated parser reads it whole, and bytes the whole parse refuses are refused too."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from mutualrl.thl.servicer import _split_items
from mutualrl.v1 import alignment_pb2 as pb

_ints = st.lists(st.integers(-(2**31), 2**31 - 1), max_size=20)
_items = st.builds(pb.TraceItem, text=st.text(max_size=30), source_token_ids=_ints,
                   source_offset_starts=_ints, source_offset_ends=_ints,
                   values=st.lists(st.floats(width=32, allow_nan=False), max_size=20))
_requests = st.builds(pb.AlignTraceRequest, source_tokenizer_id=st.text(max_size=10),
                      target_tokenizer_id=st.text(max_size=10),
                      items=st.lists(_items, max_size=5), mode=st.integers(0, 3),
                      placement=st.integers(0, 3))


def _piecewise(data: bytes) -> pb.AlignTraceRequest:
    rest, parts = _split_items(data, 1024)
    out = pb.AlignTraceRequest.FromString(rest)
    out.items.extend(pb.TraceItem.FromString(part) for part in parts)
    return out


@settings(max_examples=200, deadline=None)
@given(_requests, st.lists(_items, max_size=2))
def test_a_request_split_into_its_items_reads_as_it_does_whole(
        request: pb.AlignTraceRequest, more: list[pb.TraceItem]) -> None:
    data = request.SerializeToString()
    # Fields in any order and repeated (the last scalar wins, items add up) read the same.
    data += pb.AlignTraceRequest(items=more, mode=1).SerializeToString()
    assert _piecewise(data) == pb.AlignTraceRequest.FromString(data)
    assert len(_split_items(data, 1024)[1]) == len(request.items) + len(more)


def _reads_as_whole(data: bytes) -> None:
    try:
        whole = pb.AlignTraceRequest.FromString(data)
    except DecodeError:
        with pytest.raises(DecodeError):
            _piecewise(data)
        return
    assert _piecewise(data) == whole


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_bytes_that_do_not_parse_whole_do_not_parse_split(data: bytes) -> None:
    _reads_as_whole(data)


# Unknown groups (nested, empty, unclosed, closed by another field), a stray end tag, an
# unknown fixed32, a reserved wire type, an item longer than the body.
@pytest.mark.parametrize("data", [b"\x33\x34", b"\x33\x08\x01\x3b\x3c\x34", b"\x33",
                                  b"\x33\x3c", b"\x34", b"\x0d\x00\x00\x00\x00", b"\x0f",
                                  b"\x1a\x05ab"])
def test_unknown_fields_and_groups_read_as_they_do_whole(data: bytes) -> None:
    _reads_as_whole(data)


def test_groups_nested_past_any_depth_are_refused_not_crashed() -> None:
    with pytest.raises(DecodeError, match="nested"):
        _split_items(b"\x33" * 101 + b"\x34" * 101, 1024)


def test_a_body_of_many_fields_is_read_only_as_far_as_the_limits() -> None:
    many_items = b"\x1a\x00" * 100_000
    assert len(_split_items(many_items, 1024)[1]) == 1025  # refused for them; no more read
    with pytest.raises(DecodeError, match="too many fields"):
        _split_items(b"\x20\x01" * 100_000, 1024)  # mode, 100,000 times
    with pytest.raises(DecodeError, match="too many fields"):
        _split_items(b"\x33" + b"\x08\x01" * 100_000 + b"\x34", 1024)  # inside a group
