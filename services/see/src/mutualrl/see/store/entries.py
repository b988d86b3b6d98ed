"""Stream entries of a run: stream-id checks, reply shapes, the Redis-call wrapper (the
storage format itself, header and ids included, is `layout.py`)."""

from __future__ import annotations

import contextlib
import re

from mutualrl.common.errors import InvalidArgument, quote
from mutualrl.common.redis_errors import redis_op as _redis_op
from mutualrl.see import metrics as m

_STREAM_ID_RE = re.compile(r"^(\d{1,20})-(\d{1,20})$")
_U64_MAX = (1 << 64) - 1

# redis-py annotates every reply for every protocol and decoding at once; SEE's client speaks
# RESP2 without decoding, so these are the shapes that actually come back.
Entry = tuple[bytes, dict[bytes, bytes]]
"""One stream entry: (id, fields)."""
StreamReply = list[tuple[bytes, list[Entry]]]
"""XREAD / XREADGROUP: (stream, entries) per stream that had entries."""


def check_stream_id(value: str, field: str) -> str:
    """`<ms>-<seq>` with both parts unsigned 64-bit integers (what Redis accepts)."""
    match = _STREAM_ID_RE.match(value)
    if not match:
        raise InvalidArgument(field, f"not a stream id of the form <ms>-<seq>: {quote(value)}")
    if int(match[1]) > _U64_MAX or int(match[2]) > _U64_MAX:
        raise InvalidArgument(field, f"stream id parts must be at most 2^64-1: {quote(value)}")
    return value


LAST_ID = f"{_U64_MAX}-{_U64_MAX}"
"""The largest stream id: nothing comes after it, and Redis refuses an interval that starts
after it ("(<last id>"), so readers answer "nothing more" for it without asking."""


def is_last_id(sid: str) -> bool:
    """True for the largest stream id (leading zeros allowed, as Redis allows them)."""
    a, _, b = sid.partition("-")
    return a.isdigit() and b.isdigit() and int(a) == _U64_MAX and int(b) == _U64_MAX


def redis_op(op: str) -> contextlib.AbstractAsyncContextManager[None]:
    """A block of Redis calls: failures mapped by `mutualrl.common.redis_errors`, time and
    failures counted in SEE's metrics."""
    return _redis_op(op, m.REDIS)
