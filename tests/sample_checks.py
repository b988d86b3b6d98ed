"""Checks of the `Sample` contract shared by the rollout engines' tests."""

from __future__ import annotations

from typing import Any


def assert_text_and_offsets(s: Any, tok: Any) -> None:
    """The text is the tokens' decoding (special tokens skipped) and the offsets tile it."""
    assert s.text == tok.decode(s.token_ids, skip_special_tokens=True)
    pos = 0
    for a, b in s.offsets:
        assert a == pos and b >= a
        pos = b
    assert pos == len(s.text)
