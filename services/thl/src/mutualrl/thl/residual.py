"""Residual metrics of a tokenization: what does not survive it cleanly (pure: numpy only).

- `edit_distance(a, b)`: Levenshtein distance (insertions, deletions, substitutions), with the
  bit-parallel algorithm of Myers (1999) / Hyyro (2001) on Python integers, after stripping the
  common prefix and suffix. Exact whenever the differing middles span at most `_EXACT_CELLS`
  DP cells (len(a) * len(b); about 512 x 512 characters). Longer middles are cut into
  windows of about `_WINDOW` characters at sync points — a split position in `a` whose
  preceding `_CONTEXT` characters occur at the proportional place in `b` — and the window
  distances are summed: exact when an optimal edit script passes through the sync points (local
  edits such as lower-casing or NFKC folding), an upper bound otherwise. This keeps the cost
  linear in the text length instead of quadratic.
- `uncovered_bytes(text, starts, ends)`: UTF-8 bytes of characters no non-empty token covers.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

# Up to this many DP cells (len(a) * len(b)) the distance is computed exactly in one go.
_EXACT_CELLS = 262_144
# Window length (characters of `a`) and sync context used above that.
_WINDOW = 256
_CONTEXT = 12
# How far (characters) to look for a sync point around the proportional position.
_SEARCH = 64


def _common_affixes(a: str, b: str) -> tuple[int, int]:
    n = min(len(a), len(b))
    p = 0
    while p < n and a[p] == b[p]:
        p += 1
    s = 0
    while s < n - p and a[-1 - s] == b[-1 - s]:
        s += 1
    return p, s


def _bitparallel(a: str, b: str) -> int:
    """Levenshtein distance; the pattern `b` is held as bit vectors (len(b) bits)."""
    m = len(b)
    if m == 0:
        return len(a)
    peq: dict[str, int] = {}
    for i, ch in enumerate(b):
        peq[ch] = peq.get(ch, 0) | (1 << i)
    full = (1 << m) - 1
    top = 1 << (m - 1)
    pv, mv, score = full, 0, m
    for ch in a:
        eq = peq.get(ch, 0)
        xv = eq | mv
        xh = (((eq & pv) + pv) ^ pv) | eq
        ph = mv | (~(xh | pv) & full)
        mh = pv & xh
        if ph & top:
            score += 1
        elif mh & top:
            score -= 1
        ph = ((ph << 1) | 1) & full
        mh = (mh << 1) & full
        pv = mh | (~(xv | ph) & full)
        mv = ph & xv
    return score


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance between `a` and `b` (see the module docstring for long inputs)."""
    if a == b:
        return 0
    p, s = _common_affixes(a, b)
    a, b = a[p:len(a) - s], b[p:len(b) - s]
    if not a or not b:
        return max(len(a), len(b))
    if len(a) * len(b) <= _EXACT_CELLS:
        return _exact(a, b)
    total, i0, j0 = 0, 0, 0
    scale = len(b) / len(a)
    i = _WINDOW
    while i < len(a) - _WINDOW // 2:
        cut = _sync(a, b, i, j0, scale)
        if cut is not None:
            ci, cj = cut
            total += _exact(a[i0:ci], b[j0:cj])
            i0, j0 = ci, cj
            i = ci + _WINDOW
        else:
            i += _WINDOW // 4
    return total + _exact(a[i0:], b[j0:])


def _sync(a: str, b: str, i: int, j_min: int, scale: float) -> tuple[int, int] | None:
    """A split (i', j') near (i, i * scale) with a[i'-C:i'] == b[j'-C:j'], or None.

    Of the places the context occurs, the one nearest the proportional position wins, so a
    repeated phrase elsewhere does not pull the windows off the diagonal.
    """
    for ci in range(i, min(i + _SEARCH, len(a))):
        ctx = a[ci - _CONTEXT:ci]
        guess = max(int(ci * scale), j_min + _CONTEXT)
        if b[guess - _CONTEXT:guess] == ctx:
            return ci, guess
        after = b.find(ctx, guess - _CONTEXT + 1, guess + _SEARCH)
        before = b.rfind(ctx, max(j_min, guess - _SEARCH - _CONTEXT), guess - 1)
        best = [p + _CONTEXT for p in (after, before) if p >= 0 and p + _CONTEXT > j_min]
        if best:
            return ci, min(best, key=lambda j: abs(j - guess))
    return None


def _exact(a: str, b: str) -> int:
    if not a or not b:
        return max(len(a), len(b))
    # The shorter string as the bit pattern keeps the integers small.
    return _bitparallel(a, b) if len(b) <= len(a) else _bitparallel(b, a)


def utf8_lengths(text: str) -> NDArray[np.int64]:
    """UTF-8 byte length of every character of `text` (1-4)."""
    if not text:
        return np.zeros(0, dtype=np.int64)
    cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    return (1 + (cps >= 0x80).astype(np.int64) + (cps >= 0x800) + (cps >= 0x10000)).astype(
        np.int64)


def uncovered_bytes(text: str, starts: NDArray[np.int64], ends: NDArray[np.int64]) -> int:
    """UTF-8 bytes of the characters of `text` that no non-empty token span covers."""
    n = len(text)
    if n == 0:
        return 0
    # +1 where a token starts, -1 where it ends: the running sum counts covering tokens.
    delta = (np.bincount(starts, minlength=n + 1)[:n + 1]
             - np.bincount(ends, minlength=n + 1)[:n + 1])
    covered = np.cumsum(delta[:-1]) > 0
    if covered.all():
        return 0
    return int(utf8_lengths(text)[~covered].sum())
