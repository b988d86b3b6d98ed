"""SEE's REST answers read whole: its listings come in pages bounded by bytes (each answer names
`next_cursor`, null on the last page), and `follow_pages` asks for the next one until there is
none, joining the pages (pure: the caller brings the HTTP GET)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MAX_PAGES = 100_000


def _merge(into: dict[str, Any], page: dict[str, Any]) -> None:
    for key, value in page.items():
        if isinstance(value, list) and isinstance(into.get(key), list):
            into[key].extend(value)
        elif isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        elif key not in into:
            into[key] = value


def follow_pages(get: Callable[[str | None], dict[str, Any]]) -> dict[str, Any]:
    """Every page of a paged route joined: `get(cursor)` answers the page after `cursor` (None:
    the first); lists are concatenated, objects (a transfer matrix) merged, other fields kept
    from the first page. The result has `next_cursor` None."""
    out = get(None)
    cursor = out.get("next_cursor")
    for _ in range(MAX_PAGES):
        if not cursor:
            break
        page = get(cursor)
        cursor = page.pop("next_cursor", None)
        _merge(out, page)
    out["next_cursor"] = None
    return out
