"""Pages of SEE's answers (pure): the byte budget a page fills, and the continuation token that
says where the next page starts.

Every read that returns records or lists sizes what it would return before it loads it (a
record's length is in its index entry, `ranges.location`), takes entries while they fit the
answer's budget (`see.limits.max_response_bytes`; a page always holds its first entry) and, when
it stops early, answers a token the client sends back for the rest. A token names the position
the next page starts after, bound to the request it was given for (a digest of the fields that
fix the order of the answer), so a token sent with another request is INVALID_ARGUMENT rather
than a page of something else.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable

from mutualrl.common.errors import InvalidArgument

MAX_TOKEN_CHARS = 2048
"""Longest page token accepted (a position is ids of at most a few hundred characters)."""
_SEP = "\x1f"


class Budget:
    """The bytes an answer may still take. `take(n)` says whether an entry of `n` bytes fits,
    and counts it when it does; the first entry always fits (a page holds at least one)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.entries = 0

    def take(self, n: int) -> bool:
        if self.entries and self.used + n > self.limit:
            return False
        self.used += n
        self.entries += 1
        return True

    def force(self, n: int) -> None:
        """Count an entry that must go in whatever its size (a page's first record, which the
        budget's floor, `max_record_bytes` plus slack, always holds with its framing)."""
        self.used += n
        self.entries += 1


def request_digest(*parts: str | int | Iterable[str]) -> str:
    """A short digest of the request fields a token is bound to."""
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        items = [str(part)] if isinstance(part, str | int) else list(part)
        for item in items:
            h.update(item.encode("utf-8", "surrogatepass"))
            h.update(b"\x00")
        h.update(b"\x01")
    return h.hexdigest()


def make_token(digest: str, position: str) -> str:
    """The token of the page that starts after `position` (of the request of `digest`)."""
    return base64.urlsafe_b64encode(f"{digest}{_SEP}{position}".encode()).decode()


def read_index(token: str, digest: str, n: int, field: str = "page_token") -> int:
    """The index a token of a request over `n` entries continues from (0: the first page)."""
    position = read_token(token, digest, field)
    if position is None:
        return 0
    if not position.isdigit() or not 0 < int(position) < n:
        raise InvalidArgument(field, "not a page token of this request")
    return int(position)


def read_token(token: str, digest: str, field: str = "page_token") -> str | None:
    """The position a token names (None for an empty token: the first page); InvalidArgument
    naming `field` for a token this request was not given."""
    if not token:
        return None
    wrong = InvalidArgument(field, "not a page token of this request: send back the "
                                   "next_page_token of the previous answer, with the same request")
    if len(token) > MAX_TOKEN_CHARS:
        raise wrong
    try:
        text = base64.urlsafe_b64decode(token.encode("ascii")).decode()
    except (ValueError, binascii.Error, UnicodeError):
        raise wrong from None
    got, sep, position = text.partition(_SEP)
    if not sep or got != digest:
        raise wrong
    return position
