"""THL alignment core (`mutualrl.thl.align`): hand-checked cases and properties on synthetic
offsets (overlaps, zero-width tokens, gaps) — no tokenizers, no network."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mutualrl.thl.align import ItemAlignment, align, align_batch, concat_offsets


def _ranges(r: ItemAlignment) -> list[tuple[int, ...]]:
    c = r.chunks
    return list(zip(c.char_start.tolist(), c.char_end.tolist(), c.source_start.tolist(),
                    c.source_end.tolist(), c.target_start.tolist(), c.target_end.tolist(),
                    strict=True))


def test_gap_on_source_side_becomes_its_own_chunk() -> None:
    # "a b": the source drops the space, the target has a token for it.
    r = align(3, [(0, 1), (2, 3)], [(0, 1), (1, 2), (2, 3)], [1.0, 2.0])
    assert _ranges(r) == [(0, 1, 0, 1, 0, 1), (1, 2, 1, 1, 1, 2), (2, 3, 1, 2, 2, 3)]
    assert r.chunks.value.tolist() == [1.0, 0.0, 2.0]
    assert r.target_values.tolist() == [1.0, 0.0, 2.0]
    assert r.multi_token_chunk_share == pytest.approx(1 / 3)


def test_byte_pieces_of_one_character_stay_together() -> None:
    # Byte-level BPE: three pieces of char 1 (one also reaching into char 2) vs one char each.
    src = [(0, 1), (1, 2), (1, 2), (1, 3), (2, 3), (3, 4)]
    tgt = [(0, 1), (1, 2), (2, 3), (3, 4)]
    r = align(4, src, tgt, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    assert _ranges(r) == [(0, 1, 0, 1, 0, 1), (1, 3, 1, 5, 1, 3), (3, 4, 5, 6, 3, 4)]
    assert r.chunks.value.tolist() == [0.0, 10.0, 5.0]
    assert r.target_values.tolist() == [0.0, 0.0, 10.0, 5.0]  # placement "last"
    spread = align(4, src, tgt, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], placement="spread")
    assert spread.target_values.tolist() == [0.0, 5.0, 5.0, 5.0]


def test_self_alignment_maps_identical_pieces_one_to_one() -> None:
    src = [(0, 1), (1, 2), (1, 2), (1, 3), (2, 3), (3, 4)]
    vals = [0.5, 1.0, 2.0, 3.0, 4.0, 5.0]
    r = align(4, src, src, vals)
    assert r.target_values.tolist() == vals
    assert r.chunks.clean.all() and r.multi_token_chunk_share == 0.0


def test_zero_width_specials_join_neighbouring_chunks() -> None:
    # BOS (0,0) leads, EOS (0,0) trails: both stay inside contiguous token ranges.
    r = align(3, [(0, 0), (0, 1), (1, 3), (0, 0)], [(0, 1), (1, 2), (2, 3)], [1, 2, 3, 4])
    assert _ranges(r) == [(0, 1, 0, 2, 0, 1), (1, 3, 2, 4, 1, 3)]
    assert r.chunks.value.tolist() == [3.0, 7.0]


def test_degenerate_items() -> None:
    empty = align(0, [], [], [])
    assert _ranges(empty) == [(0, 0, 0, 0, 0, 0)]
    only_special = align(5, [(0, 0)], [(1, 2)], [7.0])
    assert _ranges(only_special) == [(0, 5, 0, 1, 0, 1)]
    assert only_special.target_values.tolist() == [7.0]
    # No target token at all: chunks still cover the source; nothing to place values on.
    no_target = align(5, [(0, 2), (2, 5)], [], [7.0, 1.0])
    assert _ranges(no_target) == [(0, 2, 0, 1, 0, 0), (2, 5, 1, 2, 0, 0)]
    assert no_target.target_values.shape == (0,)


def test_orphan_source_mass_goes_to_neighbouring_target_token() -> None:
    # The target skips char 1 (e.g. a combining mark WordPiece drops).
    r = align(3, [(0, 1), (1, 2), (2, 3)], [(0, 1), (2, 3)], [1.0, 2.0, 4.0])
    assert r.chunks.value.tolist() == [1.0, 2.0, 4.0]
    assert r.target_values.tolist() == [3.0, 4.0]
    lead = align(2, [(0, 1), (1, 2)], [(1, 2)], [1.0, 2.0])
    assert lead.target_values.tolist() == [3.0]


def test_sequence_mode_is_length_normalised_total() -> None:
    r = align(4, [(0, 2), (2, 4)], [(0, 1), (1, 2), (2, 4)], [-1.0, -3.0], mode="sequence")
    assert r.sequence_value == -2.0
    assert r.target_values.tolist() == [-2.0, -2.0, -2.0]


def test_inexact_chunk_sum_is_correctly_rounded_and_reported() -> None:
    r = align(3, [(0, 1), (1, 3)], [(0, 3)], [1e-30, 1.0])
    assert r.chunks.value.tolist() == [1.0]
    assert r.mass_error == -1e-30
    exact = align(3, [(0, 1), (1, 3)], [(0, 3)], [0.25, 1.0])
    assert exact.mass_error == 0.0 and exact.chunks.value.tolist() == [1.25]


def test_batch_equals_items_one_by_one() -> None:
    rng = np.random.default_rng(0)
    items = []
    for n in (0, 3, 7, 1, 12):
        cuts = np.sort(rng.choice(np.arange(1, 20), size=n, replace=False)) if n else []
        bounds = [0, *list(cuts), 20]
        src = list(itertools.pairwise(bounds))
        tgt = [(a, min(a + 3, 20)) for a in range(0, 20, 3)]
        items.append((src, tgt, rng.standard_normal(len(src)).astype(np.float32)))
    s0, s1, sb = concat_offsets([i[0] for i in items])
    t0, t1, tb = concat_offsets([i[1] for i in items])
    batch = align_batch([20] * len(items), s0, s1, sb, t0, t1, tb,
                        np.concatenate([i[2] for i in items]))
    for k, (src, tgt, vals) in enumerate(items):
        one = align(20, src, tgt, vals)
        got = batch.item(k)
        assert _ranges(got) == _ranges(one)
        assert got.target_values.tolist() == one.target_values.tolist()


# -- properties on synthetic tokenizations -----------------------------------------------------

@st.composite
def tokenization(draw: st.DrawFn, length: int) -> list[tuple[int, int]]:
    """Tokens in text order with gaps, overlaps (byte pieces) and zero-width specials."""
    tokens: list[tuple[int, int]] = []
    if draw(st.booleans()):
        tokens.append((0, 0))
    pos = 0
    while pos < length:
        kind = draw(st.sampled_from(["tok", "tok", "tok", "gap", "pieces", "special"]))
        width = draw(st.integers(1, min(4, length - pos)))
        if kind == "gap":
            pos += width
        elif kind == "special":
            tokens.append((0, 0))
        elif kind == "pieces":
            tokens.extend([(pos, pos + 1)] * draw(st.integers(2, 4)))
            if pos + 2 <= length and draw(st.booleans()):
                tokens.append((pos, pos + 2))  # a piece that reaches into the next char
                pos += 1
            pos += 1
        else:
            tokens.append((pos, pos + width))
            pos += width
    if draw(st.booleans()):
        tokens.append((0, 0))
    return tokens


@st.composite
def aligned_pair(draw: st.DrawFn) -> tuple[int, list[tuple[int, int]], list[tuple[int, int]],
                                          list[float]]:
    length = draw(st.integers(0, 30))
    src = draw(tokenization(length))
    tgt = draw(tokenization(length))
    # Behaviour log-probs as float32 (the wire type): 0 or at least 2**-20 (~1e-6) in magnitude.
    logp = st.one_of(st.just(0.0), st.floats(-30, -2.0**-20, width=32))
    vals = draw(st.lists(logp, min_size=len(src), max_size=len(src)))
    return length, src, tgt, vals


def _check_structure(length: int, src: list[tuple[int, int]], tgt: list[tuple[int, int]],
                     r: ItemAlignment) -> None:
    c = r.chunks
    assert len(c) >= 1
    assert c.char_start[0] == 0 and c.char_end[-1] == length
    assert (c.char_start[1:] == c.char_end[:-1]).all()
    assert (c.char_end >= c.char_start).all()
    for start, end, n in ((c.source_start, c.source_end, len(src)),
                          (c.target_start, c.target_end, len(tgt))):
        assert start[0] == 0 and end[-1] == n
        assert (start[1:] == end[:-1]).all() and (end >= start).all()
    # Every non-empty token lies inside its chunk's characters.
    for toks, st_, en_ in ((src, c.source_start, c.source_end),
                           (tgt, c.target_start, c.target_end)):
        for k in range(len(c)):
            for a, b in toks[st_[k]:en_[k]]:
                if b > a:
                    assert c.char_start[k] <= a and b <= c.char_end[k]


@settings(max_examples=100, deadline=None)
@given(aligned_pair())
def test_chunks_cover_text_and_tokens_contiguously(case: tuple) -> None:
    length, src, tgt, vals = case
    _check_structure(length, src, tgt, align(length, src, tgt, vals))


@settings(max_examples=100, deadline=None)
@given(aligned_pair())
def test_swapping_sides_swaps_chunks(case: tuple) -> None:
    length, src, tgt, _ = case
    ab = _ranges(align(length, src, tgt))
    ba = _ranges(align(length, tgt, src))
    assert ab == [(cs, ce, ts, te, ss, se) for cs, ce, ss, se, ts, te in ba]


@settings(max_examples=100, deadline=None)
@given(aligned_pair(), st.sampled_from(["last", "spread"]))
def test_chunk_sums_conserve_mass_exactly(case: tuple, placement: str) -> None:
    length, src, tgt, vals = case
    r = align(length, src, tgt, vals, placement=placement)  # type: ignore[arg-type]
    c = r.chunks
    for k in range(len(c)):
        assert c.value[k] == math.fsum(vals[c.source_start[k]:c.source_end[k]])
    # float32 log-probs: every chunk sum is exact, so the totals agree as exact rationals.
    assert r.mass_error == 0.0
    assert sum(map(Fraction, c.value.tolist()), Fraction(0)) == sum(map(Fraction, vals),
                                                                     Fraction(0))
    if any(b > a for a, b in tgt):
        assert math.fsum(r.target_values) == pytest.approx(math.fsum(vals), abs=1e-9)


@settings(max_examples=50, deadline=None)
@given(aligned_pair(), st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32),
                                min_size=40, max_size=40))
def test_mass_error_reports_the_exact_leftover_for_any_values(case: tuple,
                                                             pool: list[float]) -> None:
    """Arbitrary float32 values (1e-30 next to 1e30): each chunk value is still the correctly
    rounded sum, and mass_error is exactly what the chunks lost, rounded once."""
    length, src, tgt, _ = case
    vals = pool[:len(src)]
    if len(vals) < len(src):
        vals = vals + [0.0] * (len(src) - len(vals))
    r = align(length, src, tgt, vals)
    c = r.chunks
    for k in range(len(c)):
        assert c.value[k] == math.fsum(vals[c.source_start[k]:c.source_end[k]])
    leftover = (sum(map(Fraction, c.value.tolist()), Fraction(0))
                - sum(map(Fraction, vals), Fraction(0)))
    assert r.mass_error == float(leftover)


@settings(max_examples=100, deadline=None)
@given(aligned_pair())
def test_self_alignment_is_identity(case: tuple) -> None:
    length, src, _, vals = case
    r = align(length, src, src, vals)
    assert r.target_values.tolist() == [float(v) for v in vals]
    assert r.chunks.clean.all() and r.multi_token_chunk_share == 0.0 and r.mass_error == 0.0


@settings(max_examples=100, deadline=None)
@given(aligned_pair())
def test_chunks_are_shortest(case: tuple) -> None:
    """No interior position could split a chunk into two parts that both hold tokens."""
    length, src, tgt, _ = case
    r = align(length, src, tgt)
    c = r.chunks

    def cut_ok(toks: list[tuple[int, int]], lo: int, hi: int, q: int) -> bool:
        inside = [(a, b) for a, b in toks[lo:hi] if b > a]
        return any(all(b <= q for _, b in inside[:i]) and all(a >= q for a, _ in inside[i:])
                   for i in range(len(inside) + 1))

    for k in range(len(c)):
        s_lo, s_hi = int(c.source_start[k]), int(c.source_end[k])
        t_lo, t_hi = int(c.target_start[k]), int(c.target_end[k])
        toks = [(a, b) for a, b in [*src[s_lo:s_hi], *tgt[t_lo:t_hi]] if b > a]
        for q in range(int(c.char_start[k]) + 1, int(c.char_end[k])):
            if cut_ok(src, s_lo, s_hi, q) and cut_ok(tgt, t_lo, t_hi, q):
                left = any(b <= q for _, b in toks)
                right = any(a >= q for a, _ in toks)
                assert not (left and right), (k, q)


def test_pure_modules_import_no_network_code() -> None:
    import subprocess
    import sys

    code = ("import sys, mutualrl.thl.align, mutualrl.thl.residual, "
            "mutualrl.common.alignment_types, mutualrl.thl.corpus; "
            "bad = [m for m in ('grpc', 'redis', 'fastapi', 'transformers') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@settings(max_examples=60, deadline=None)
@given(st.lists(aligned_pair(), min_size=1, max_size=6))
def test_batched_items_align_as_if_alone(cases: list[tuple]) -> None:
    """Items laid end to end (including empty texts and items without tokens) never interact."""
    s0, s1, sb = concat_offsets([c[1] for c in cases])
    t0, t1, tb = concat_offsets([c[2] for c in cases])
    vals = np.array([v for c in cases for v in c[3]], dtype=np.float64)
    batch = align_batch([c[0] for c in cases], s0, s1, sb, t0, t1, tb, vals)
    for k, (length, src, tgt, v) in enumerate(cases):
        alone, got = align(length, src, tgt, v), batch.item(k)
        assert _ranges(got) == _ranges(alone)
        assert got.chunks.value.tolist() == alone.chunks.value.tolist()
        assert got.target_values.tolist() == alone.target_values.tolist()
        assert got.multi_token_chunk_share == alone.multi_token_chunk_share
