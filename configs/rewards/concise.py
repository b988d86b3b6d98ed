"""An example reward function of one's own, with TRL's signature (docs/experiments.md).

    task:
      rewards:
        - {fn: math_verify}
        - {fn: configs/rewards/concise.py:concise, weight: 0.1}
"""

from __future__ import annotations

from typing import Any


def concise(prompts: list[Any], completions: list[Any], completion_ids: list[list[int]],
            **columns: Any) -> list[float | None]:
    """1 for a completion of at most `budget` tokens (default 256), falling linearly to 0 at
    twice that; None (no opinion) for a completion that stated no answer at all."""
    budget = 256
    out: list[float | None] = []
    for text, ids in zip(completions, completion_ids, strict=True):
        if not isinstance(text, str):  # chat-message prompts give [{"role", "content"}]
            text = "".join(m["content"] for m in text)
        if not any(ch.isdigit() for ch in text):
            out.append(None)
            continue
        out.append(max(0.0, min(1.0, 2.0 - len(ids) / budget)))
    return out
