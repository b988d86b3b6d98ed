"""Chunk alignment of two tokenizations of the same text (pure: numpy only, no network code);
docs/design.md (10).

Inputs per item: the text length L (in characters, i.e. Unicode code points), the source
tokens' character offsets (start, end; end exclusive), the target tokens' offsets, and one value
per source token (e.g. behaviour log-probs). Output: chunks — the shortest spans of text whose
both ends are token boundaries on both sides — with their source/target token ranges and the
exact sum of their source values, plus the values placed on target tokens.

How awkward offsets become chunks (the rules every caller can rely on):

1. Zero-width tokens (start == end: special tokens at (0, 0), empty pieces) carry no text. They
   never block a boundary; each joins the chunk of the nearest *preceding* non-empty token of
   its side (index order), and zero-width tokens before the first non-empty token join the
   item's first chunk. This keeps token ranges contiguous even for an EOS at (0, 0).
2. Non-empty tokens are grouped into *atoms*: a cut between token i and i+1 (index order) is
   allowed only when every later token starts at or after every earlier token ends
   (suffix-min of starts >= prefix-max of ends). Byte-level BPE pieces of one multibyte
   character share that character's offsets, and pieces like `¥æ` (13, 15) overlap both of their
   neighbours; such runs form one atom, so a character is never split between chunks.
   Overlapping pieces from normalisation (NFKC `ﬁ` -> `f`,`i` at the same offsets, spaces that
   WordPiece's BertNormalizer inserts around CJK characters) are handled the same way.
3. Each side's allowed cut positions form closed intervals: between atoms a and a+1 every
   position in [end(a), start(a+1)] is a valid cut (text in a gap — whitespace WordPiece drops,
   Metaspace `▁` offsets, combining marks a tokenizer skips — belongs to no token of that side).
   Common boundaries are the intersecting (source interval, target interval) pairs, found by a
   linear merge (two `searchsorted` calls on the sorted interval arrays). A boundary sits at the
   earliest position both sides allow (max of the two interval starts), so gap text goes to the
   chunk after it; the first chunk starts at 0 and the last ends at L.
   What this means per tokenizer family: WordPiece `##` continuation pieces have ordinary
   adjacent offsets (the `##` is not text), so they need no rule; Metaspace (`▁`) and GPT-2
   (`Ġ`) pieces carry a space inside a word's token, while WordPiece here isolates it as its
   own piece, so the space and its word form one multi-token chunk; a Metaspace `▁` prepended to the
   first word (prepend_scheme "first") gets the first character's offsets and overlaps it
   (rule 2).
4. Chunks therefore cover [0, L) contiguously, their source ranges cover [0, n) and target ranges
   [0, m) contiguously (a range may be empty: text only one side covers), and every non-empty
   token lies inside its chunk's character range. The construction is symmetric: swapping the
   sides swaps the token ranges and keeps the character ranges. An item with no non-empty token
   on either side is one chunk [0, L) holding all its tokens.

Values: a chunk's value is the exact sum of its source tokens' values, rounded once to float64
(`math.fsum` semantics). The fast path sums in float64 and *proves* each multi-token sum exact
(all partial sums are integer multiples of the smallest set bit of the chunk's values and stay
below 2**53 of those — guaranteed for float32 values with |v| < 32 that are 0 or >= 2**-20 in
magnitude, in chunks of fewer than 32 tokens: behaviour log-probs); chunks it cannot prove are
re-summed with `math.fsum`. When every chunk sum is exact (always the case for the proven ones)
the chunk values add up to exactly the source total; `mass_error` reports the exact leftover
otherwise (a chunk whose true sum is not a float64, e.g. 1e-30 + 1.0).

Placement on target tokens: `last` puts a chunk's value on its last target token, `spread`
divides it evenly over its target tokens. A chunk whose source and target tokens pair
one-to-one with identical offsets (self-alignment, or a multibyte character both byte-level
tokenizers split the same way) maps values token by token instead. A chunk with source tokens
but no target token (text the target tokenizer drops) hands its value to the last target token
before it (the first one after it when none precedes), so target values still sum to the chunk
total. `sequence` mode puts the length-normalised total sum(values) / n on every target token.

Performance: everything is a handful of vectorised numpy passes over the whole batch (items are
laid end to end on one global character axis with a one-character gap between items, which
keeps every boundary inside its own item), so a batch costs O(n + m) array work plus a constant
number of numpy calls, not per-token Python.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from numpy.typing import ArrayLike, NDArray

from mutualrl.common.alignment_types import Chunks, FloatArray, IntArray, Mode, Placement

_TWO53 = float(2**53)



@dataclass(frozen=True)
class ItemAlignment:
    """The alignment of one item; token/char offsets relative to the item."""

    chunks: Chunks
    target_values: FloatArray
    sequence_value: float
    mass_error: float
    multi_token_chunk_share: float


@dataclass(frozen=True)
class BatchAlignment:
    """Alignments of a batch, concatenated; `chunk_bounds[i]:chunk_bounds[i+1]` is item i."""

    chunks: Chunks  # global coordinates (see `item`)
    chunk_bounds: IntArray
    target_values: FloatArray
    target_bounds: IntArray
    source_bounds: IntArray
    char_bases: IntArray
    sequence_values: FloatArray
    mass_errors: FloatArray
    multi_token_chunk_share: FloatArray

    def __len__(self) -> int:
        return int(self.chunk_bounds.shape[0] - 1)

    def item(self, i: int) -> ItemAlignment:
        lo, hi = int(self.chunk_bounds[i]), int(self.chunk_bounds[i + 1])
        t0, t1 = int(self.target_bounds[i]), int(self.target_bounds[i + 1])
        chunks = self.chunks.slice(lo, hi).shifted(int(self.char_bases[i]),
                                                   int(self.source_bounds[i]), t0)
        return ItemAlignment(chunks, self.target_values[t0:t1], float(self.sequence_values[i]),
                             float(self.mass_errors[i]), float(self.multi_token_chunk_share[i]))


@dataclass(frozen=True)
class _Side:
    """One side's cut intervals on the global character axis, with the token index of each cut."""

    lo: IntArray
    hi: IntArray
    cut_token: IntArray
    interval_bounds: IntArray  # per item: its intervals are interval_bounds[t]:[t+1]


def _bounds(lengths: IntArray) -> IntArray:
    out = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _side(starts: IntArray, ends: IntArray, token_bounds: IntArray, char_bases: IntArray,
          text_lengths: IntArray) -> _Side:
    """Atoms and cut intervals of one side, for the whole batch at once (rules 1-3)."""
    n_items = token_bounds.shape[0] - 1
    item_of_token = np.repeat(np.arange(n_items, dtype=np.int64), np.diff(token_bounds))
    nonempty = np.flatnonzero(ends > starts)
    shift = char_bases[item_of_token[nonempty]]
    s = starts[nonempty] + shift
    e = ends[nonempty] + shift
    if nonempty.shape[0]:
        premax_e = np.maximum.accumulate(e)
        sufmin_s = np.minimum.accumulate(s[::-1])[::-1]
        # Token j+1 opens a new atom when nothing before it reaches past where everything from
        # it on begins. Items occupy disjoint global ranges, so item starts always qualify.
        first = np.empty(s.shape[0], dtype=bool)
        first[0] = True
        np.greater_equal(sufmin_s[1:], premax_e[:-1], out=first[1:])
        atom_first = np.flatnonzero(first)
        atom_start = sufmin_s[atom_first]
        atom_end = premax_e[np.append(atom_first[1:] - 1, s.shape[0] - 1)]
        atom_first_token = nonempty[atom_first]
        atom_item = item_of_token[atom_first_token]
    else:
        atom_start = atom_end = atom_first_token = atom_item = np.zeros(0, dtype=np.int64)
    atoms_per_item = np.bincount(atom_item, minlength=n_items)
    atom_bounds = _bounds(atoms_per_item)
    item_end = char_bases + text_lengths
    # Item t's intervals: [base, start(a0)], [end(a0), start(a1)], ..., [end(a_last), base + L].
    lo = np.insert(atom_end, atom_bounds[:-1], char_bases)
    hi = np.insert(atom_start, atom_bounds[1:], item_end)
    # The cut before atom a is at its first non-empty token (zero-width tokens before it stay
    # with the previous atom); the cut after the item's last atom is at the item's end.
    cut_token = np.insert(atom_first_token, atom_bounds[1:], token_bounds[1:])
    return _Side(lo, hi, cut_token, _bounds(atoms_per_item + 1))


def _exact_chunk_sums(values: FloatArray, start: IntArray, end: IntArray
                      ) -> tuple[FloatArray, NDArray[np.bool_]]:
    """Per chunk: the correctly rounded sum of values[start:end], and whether it is exact."""
    n_chunks = start.shape[0]
    sums = np.zeros(n_chunks, dtype=np.float64)
    exact = np.ones(n_chunks, dtype=bool)
    counts = end - start
    nz = np.flatnonzero(counts > 0)
    if nz.shape[0] == 0:
        return sums, exact
    seg = start[nz]
    sums[nz] = np.add.reduceat(values, seg)
    multi = nz[counts[nz] > 1]
    if multi.shape[0] == 0:
        return sums, exact
    # Exactness certificate: every value is an integer multiple of its lowest set bit q_i, so
    # every partial sum of a chunk is a multiple of Q = min q_i bounded by sum|v|; below
    # 2**53 * Q all of them are float64-representable and sequential float64 addition is exact.
    mant, expo = np.frexp(values)
    m_int = np.ldexp(mant, 53).astype(np.int64)
    low = np.ldexp((m_int & -m_int).astype(np.float64), expo - 53)
    low[values == 0.0] = np.inf
    qmin = np.minimum.reduceat(low, seg)
    babs = np.add.reduceat(np.abs(values), seg)
    # 2**-40 of headroom covers the rounding of the float64 bound itself.
    proven = babs * (1.0 + 2.0**-40) < np.ldexp(qmin, 53)
    need = np.flatnonzero(~proven)
    if need.shape[0]:
        idx = nz[need]
        idx = idx[counts[idx] > 1]
        for c in idx.tolist():
            chunk = values[start[c]:end[c]].tolist()
            try:
                sums[c] = math.fsum(chunk)
            except OverflowError:
                sums[c] = math.inf if sum(chunk) > 0 else -math.inf
            # fsum is exact-then-rounded; whether the rounding lost anything needs exact
            # rational arithmetic (rare path: only chunks the certificate could not prove).
            exact[c] = math.isfinite(sums[c]) and (
                sum((Fraction(v) for v in chunk), Fraction(0)) == Fraction(float(sums[c])))
    return sums, exact


def _clean_chunks(src_start: IntArray, src_end: IntArray, tgt_start: IntArray, tgt_end: IntArray,
                  s_starts: IntArray, s_ends: IntArray, t_starts: IntArray, t_ends: IntArray
                  ) -> NDArray[np.bool_]:
    """Chunks whose tokens pair one-to-one: 0 and 0, 1 and 1, or equal counts with identical
    offsets."""
    ns = src_end - src_start
    nt = tgt_end - tgt_start
    clean: NDArray[np.bool_] = (ns == nt) & (ns <= 1)
    cand = np.flatnonzero((ns == nt) & (ns > 1))
    if cand.shape[0]:
        lens = ns[cand]
        within = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(_bounds(lens)[:-1], lens)
        si = np.repeat(src_start[cand], lens) + within
        ti = np.repeat(tgt_start[cand], lens) + within
        mismatch = (s_starts[si] != t_starts[ti]) | (s_ends[si] != t_ends[ti])
        bad = np.add.reduceat(mismatch.astype(np.int64), _bounds(lens)[:-1])
        clean[cand] = bad == 0
    return clean


def align_batch(
    text_lengths: ArrayLike,
    source_starts: ArrayLike,
    source_ends: ArrayLike,
    source_bounds: ArrayLike,
    target_starts: ArrayLike,
    target_ends: ArrayLike,
    target_bounds: ArrayLike,
    values: ArrayLike | None = None,
    *,
    mode: Mode = "chunk",
    placement: Placement = "last",
) -> BatchAlignment:
    """Align a batch of items whose token arrays are concatenated.

    `source_bounds` (length B+1) delimits item i's source tokens as
    `source_starts[source_bounds[i]:source_bounds[i+1]]` (offsets relative to item i's text);
    likewise `target_bounds`. `values` has one entry per source token (zeros when None).
    Offsets must satisfy 0 <= start <= end <= L for their item (callers validate; see
    `validate_offsets`).
    """
    lengths = np.asarray(text_lengths, dtype=np.int64)
    s_st = np.asarray(source_starts, dtype=np.int64)
    s_en = np.asarray(source_ends, dtype=np.int64)
    s_b = np.asarray(source_bounds, dtype=np.int64)
    t_st = np.asarray(target_starts, dtype=np.int64)
    t_en = np.asarray(target_ends, dtype=np.int64)
    t_b = np.asarray(target_bounds, dtype=np.int64)
    n_src = int(s_b[-1])
    vals = (np.zeros(n_src, dtype=np.float64) if values is None
            else np.asarray(values, dtype=np.float64))
    n_items = lengths.shape[0]
    # Items sit end to end with a one-character gap so no interval of one touches the next.
    char_bases = np.zeros(n_items, dtype=np.int64)
    if n_items > 1:
        np.cumsum(lengths[:-1] + 1, out=char_bases[1:])

    src = _side(s_st, s_en, s_b, char_bases, lengths)
    tgt = _side(t_st, t_en, t_b, char_bases, lengths)

    # Rule 3: the merge. For each source interval k the intersecting target intervals are the
    # contiguous run l in [first, last]; pairs in (k, l) order are the boundary chain.
    first = np.searchsorted(tgt.hi, src.lo, side="left")
    last = np.searchsorted(tgt.lo, src.hi, side="right") - 1
    counts = np.maximum(last - first + 1, 0)
    total = int(counts.sum())
    pair_k = np.repeat(np.arange(src.lo.shape[0], dtype=np.int64), counts)
    pair_l = (np.repeat(first - _bounds(counts)[:-1], counts)
              + np.arange(total, dtype=np.int64))
    item_of_interval = np.repeat(np.arange(n_items, dtype=np.int64), np.diff(src.interval_bounds))
    pair_item = item_of_interval[pair_k]
    pos = np.maximum(src.lo[pair_k], tgt.lo[pair_l])
    pcut_s = src.cut_token[pair_k]
    pcut_t = tgt.cut_token[pair_l]

    # An item with a single common boundary (no non-empty token on either side) gets it twice,
    # so that it still has one chunk [0, L).
    per_item = np.bincount(pair_item, minlength=n_items)
    pb = _bounds(per_item)
    single = np.flatnonzero(per_item == 1)
    if single.shape[0]:
        rep = np.ones(total, dtype=np.int64)
        rep[pb[single]] = 2
        pos, pcut_s, pcut_t, pair_item = (np.repeat(a, rep) for a in
                                          (pos, pcut_s, pcut_t, pair_item))
        per_item = np.maximum(per_item, 2)
        pb = _bounds(per_item)
    # Force the ends: first boundary at (0, first token), last at (L, end token) of each item.
    firsts, lasts = pb[:-1], pb[1:] - 1
    pos[firsts] = char_bases
    pos[lasts] = char_bases + lengths
    pcut_s[firsts] = s_b[:-1]
    pcut_s[lasts] = s_b[1:]
    pcut_t[firsts] = t_b[:-1]
    pcut_t[lasts] = t_b[1:]

    # Chunks are consecutive boundaries of the same item.
    keep = np.ones(pos.shape[0] - 1, dtype=bool) if pos.shape[0] else np.zeros(0, dtype=bool)
    keep[lasts[:-1]] = False
    lo_i = np.flatnonzero(keep)
    c_char_start, c_char_end = pos[lo_i], pos[lo_i + 1]
    c_src_start, c_src_end = pcut_s[lo_i], pcut_s[lo_i + 1]
    c_tgt_start, c_tgt_end = pcut_t[lo_i], pcut_t[lo_i + 1]
    chunk_bounds = _bounds(per_item - 1)

    chunk_vals, exact = _exact_chunk_sums(vals, c_src_start, c_src_end)
    clean = _clean_chunks(c_src_start, c_src_end, c_tgt_start, c_tgt_end, s_st, s_en, t_st, t_en)
    chunks = Chunks(c_char_start, c_char_end, c_src_start, c_src_end, c_tgt_start, c_tgt_end,
                    chunk_vals, clean)

    # Residual: target tokens inside chunks that do not pair one-to-one.
    nt = c_tgt_end - c_tgt_start
    chunk_item = np.repeat(np.arange(n_items, dtype=np.int64), per_item - 1)
    multi_tokens = np.bincount(chunk_item, weights=np.where(clean, 0, nt), minlength=n_items)
    n_tgt = np.diff(t_b)
    share = np.divide(multi_tokens, n_tgt, out=np.zeros(n_items), where=n_tgt > 0)

    # Exact per-item mass leftover (0 whenever every chunk sum is exact).
    mass_errors = np.zeros(n_items, dtype=np.float64)
    for it in np.unique(chunk_item[~exact]).tolist():
        lo, hi = int(chunk_bounds[it]), int(chunk_bounds[it + 1])
        a, b = int(s_b[it]), int(s_b[it + 1])
        mass_errors[it] = _exact_difference(chunk_vals[lo:hi].tolist(), vals[a:b].tolist())

    n_src_items = np.diff(s_b)
    seq_totals = _item_sums(vals, s_b)
    seq_values = np.divide(seq_totals, n_src_items, out=np.zeros(n_items),
                           where=n_src_items > 0)

    n_tgt_total = int(t_b[-1])
    if mode == "sequence":
        target_values = np.repeat(seq_values, n_tgt)
    else:
        target_values = _place(chunks, t_b, chunk_item, vals, n_tgt_total, placement)
    return BatchAlignment(chunks, chunk_bounds, target_values, t_b, s_b, char_bases, seq_values,
                          mass_errors, share)


def _item_sums(values: FloatArray, bounds: IntArray) -> FloatArray:
    """Per item: the correctly rounded sum of its values (same certificate / fsum as chunks)."""
    return _exact_chunk_sums(values, bounds[:-1], bounds[1:])[0]


def _exact_difference(chunk_values: list[float], values: list[float]) -> float:
    """Exact sum(chunk_values) - sum(values), rounded once."""
    try:
        return math.fsum([*chunk_values, *(-v for v in values)])
    except OverflowError:
        return math.nan


def _place(chunks: Chunks, t_b: IntArray, chunk_item: IntArray, values: FloatArray,
           n_tgt_total: int, placement: Placement) -> FloatArray:
    """Target values from chunk values (see the module docstring for the rules)."""
    out = np.zeros(n_tgt_total, dtype=np.float64)
    if n_tgt_total == 0:
        return out
    nt = chunks.target_end - chunks.target_start
    ns = chunks.source_end - chunks.source_start
    one_to_one = chunks.clean & (ns > 1)
    regular = (nt > 0) & ~one_to_one
    if placement == "spread":
        r = np.flatnonzero(regular)
        counts = nt[r]
        idx = (np.repeat(chunks.target_start[r] - _bounds(counts)[:-1], counts)
               + np.arange(int(counts.sum()), dtype=np.int64))
        out[idx] = np.repeat(chunks.value[r] / counts, counts)
    else:
        r = np.flatnonzero(regular)
        out[chunks.target_end[r] - 1] = chunks.value[r]
    o = np.flatnonzero(one_to_one)
    if o.shape[0]:
        lens = ns[o]
        within = np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(_bounds(lens)[:-1], lens)
        out[np.repeat(chunks.target_start[o], lens) + within] = values[
            np.repeat(chunks.source_start[o], lens) + within]
    # Orphans: source mass over text the target does not cover goes to the nearest target
    # token of the same item (the one before, else the one after).
    orphan = np.flatnonzero((nt == 0) & (ns > 0))
    if orphan.shape[0]:
        items = chunk_item[orphan]
        before = chunks.target_start[orphan] - 1
        has_before = before >= t_b[items]
        dest = np.where(has_before, before, chunks.target_start[orphan])
        ok = dest < t_b[items + 1]
        out += np.bincount(dest[ok], weights=chunks.value[orphan][ok], minlength=n_tgt_total)
    return out


def align(text_length: int, source_offsets: ArrayLike, target_offsets: ArrayLike,
          values: ArrayLike | None = None, *, mode: Mode = "chunk",
          placement: Placement = "last") -> ItemAlignment:
    """Align one item; offsets are (n, 2) arrays (or sequences of (start, end) pairs)."""
    s = _as_offsets(source_offsets)
    t = _as_offsets(target_offsets)
    batch = align_batch([text_length], s[:, 0], s[:, 1], [0, s.shape[0]], t[:, 0], t[:, 1],
                        [0, t.shape[0]], values, mode=mode, placement=placement)
    return batch.item(0)


def _as_offsets(offsets: ArrayLike) -> IntArray:
    arr = np.asarray(offsets, dtype=np.int64)
    if arr.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(f"offsets must have shape (n, 2), got {arr.shape}")
    return arr


def validate_offsets(starts: IntArray, ends: IntArray, text_length: int) -> str | None:
    """None when 0 <= start <= end <= text_length for every token, else what is wrong."""
    if starts.shape != ends.shape:
        return f"{starts.shape[0]} starts but {ends.shape[0]} ends"
    if starts.shape[0] == 0:
        return None
    bad = np.flatnonzero((starts < 0) | (ends < starts) | (ends > text_length))
    if bad.shape[0]:
        i = int(bad[0])
        return (f"token {i} has offsets ({int(starts[i])}, {int(ends[i])}) outside "
                f"0 <= start <= end <= {text_length}")
    return None


def concat_offsets(offsets: Sequence[ArrayLike]) -> tuple[IntArray, IntArray, IntArray]:
    """Concatenate per-item (n_i, 2) offset arrays into (starts, ends, bounds)."""
    arrs = [_as_offsets(o) for o in offsets]
    bounds = _bounds(np.array([a.shape[0] for a in arrs], dtype=np.int64))
    if not arrs or bounds[-1] == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty.copy(), bounds
    cat = np.concatenate(arrs, axis=0)
    return np.ascontiguousarray(cat[:, 0]), np.ascontiguousarray(cat[:, 1]), bounds
