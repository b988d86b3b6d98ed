"""The parameters SEE's REST routes and its dashboard's routes share, each with the pattern it
must match, so the OpenAPI document says exactly what a route accepts (schemathesis holds the
routes to it); and the pages of the transfer counts the routes answer in."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import Path, Query

from mutualrl.common.bounds import MAX_ROUND
from mutualrl.common.ids import NAME, RECORD_KEY, RUN_ID
from mutualrl.see.store.paging import Budget


def uint_pattern(max_value: int) -> str:
    """A regular expression (unanchored) of the decimal numbers 0..max_value, leading zeros
    allowed as Redis allows them: shorter numbers, then for each digit of max_value the
    numbers that share its prefix and are smaller at that digit, then max_value itself."""
    digits = str(max_value)
    alternatives = [f"[0-9]{{1,{len(digits) - 1}}}"] if len(digits) > 1 else []
    for i, d in enumerate(digits):
        if d != "0":
            rest = len(digits) - i - 1
            tail = f"[0-9]{{{rest}}}" if rest else ""
            alternatives.append(f"{digits[:i]}[0-{int(d) - 1}]{tail}")
    alternatives.append(digits)
    return "(?:" + "|".join(alternatives) + ")"


_U64 = uint_pattern(2**64 - 1)
STREAM_ID_PATTERN = f"^{_U64}-{_U64}$"
"""`<ms>-<seq>`, both parts at most 2^64-1: exactly the stream ids Redis takes."""
RunId = Annotated[str, Path(pattern=RUN_ID.pattern, description=f"Run id: {RUN_ID.described}.")]
RecordKey = Annotated[str, Path(pattern=RECORD_KEY.pattern,
                                description=f"Record id: {RECORD_KEY.described}.")]
PolicyFilter = Annotated[str | None, Query(pattern=NAME.pattern,
                                           description="Producing policy.")]
Cursor = Annotated[str | None, Query(pattern=STREAM_ID_PATTERN,
                                     description="next_cursor of the previous page.")]
TRANSFER_CURSOR_PATTERN = (f"^{NAME.pattern[1:-1]}\\|{NAME.pattern[1:-1]}\\|[1-9][0-9]{{0,9}}$")
TransferCursor = Annotated[str | None, Query(
    pattern=TRANSFER_CURSOR_PATTERN, description="next_cursor of the previous page "
    "(\"<taker>|<source>|<kind number>\")")]
RoundQuery = Annotated[int | None, Query(ge=0, le=MAX_ROUND)]

JSON_GROWTH = 4
"""How much larger than its protobuf an answer grows as JSON, at most (names repeated as keys,
numbers as text): a REST page of protobuf-sized entries takes this share of the budget."""
_TRANSFER_JSON_BYTES = 160
"""A transfer count's JSON beside its two policy ids: the list entry and the matrix cell."""

Transfer = tuple[str, str, int, int]
"""(taker, source, kind, count)."""


def transfer_page(transfers: Sequence[Transfer], cursor: str | None, budget: int
                  ) -> tuple[list[Transfer], str | None]:
    """The transfer counts after `cursor` ("<taker>|<source>|<kind>") in that order that fit
    `budget` bytes of JSON (at least one), and the cursor of the next page (None: no more)."""
    after = None
    if cursor is not None:
        taker, source, kind = cursor.split("|")
        after = (taker, source, int(kind))
    room = Budget(budget)
    page: list[Transfer] = []
    for t in sorted(transfers):
        if after is not None and t[:3] <= after:
            continue
        if not room.take(2 * (len(t[0]) + len(t[1])) + _TRANSFER_JSON_BYTES):
            last = page[-1]
            return page, f"{last[0]}|{last[1]}|{last[2]}"
        page.append(t)
    return page, None
