"""The parameters SEE's REST routes and its dashboard's routes share, each with the pattern it
must match, so the OpenAPI document says exactly what a route accepts (schemathesis holds the
routes to it)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

from mutualrl.common.ids import NAME, RECORD_KEY, RUN_ID


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
