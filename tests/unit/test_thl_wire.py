"""THL's answers written to the wire from numpy (`alignment_wire.tokenized_bytes`,
`aligned_bytes`, `result_bytes`) parse, with the generated messages, to exactly what was
written: property-tested over ids and offsets at every varint width (0, 127, 128, 2^31 - 1),
empty arrays, negative and non-finite values, and real alignments of every tokenizer family."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mutualrl.bench.testing.thl import trained_tokenizers
from mutualrl.common import alignment_types as at
from mutualrl.common import alignment_wire as wire
from mutualrl.thl.engine import AlignmentEngine
from mutualrl.v1 import alignment_pb2 as pb

EDGES = (0, 1, 127, 128, 16_383, 16_384, 2**21, 2**28, 2**31 - 1)
int32s = st.one_of(st.sampled_from(EDGES), st.integers(0, 2**31 - 1))
doubles = st.floats(allow_nan=True, allow_infinity=True)


def _ints(n: int) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(np.int64, n, elements=int32s)


residuals = st.builds(at.Residual, st.integers(0, 2**40), st.floats(0, 1),
                      st.integers(0, 2**40), st.integers(0, 2**40))


@st.composite
def tokenized(draw: st.DrawFn) -> at.TokenizedText:
    n = draw(st.integers(0, 300))
    return at.TokenizedText(draw(_ints(n)), draw(_ints(2 * n)).reshape(n, 2),
                            draw(st.text(max_size=50)), draw(residuals))


@st.composite
def aligned(draw: st.DrawFn) -> at.AlignedTrace:
    m, c = draw(st.integers(0, 200)), draw(st.integers(0, 200))
    cols = [draw(_ints(c)) for _ in range(6)]
    chunks = at.Chunks(*cols, draw(hnp.arrays(np.float64, c, elements=doubles)),
                       draw(hnp.arrays(np.bool_, c)))
    return at.AlignedTrace(draw(_ints(m)), draw(_ints(2 * m)).reshape(m, 2),
                           draw(hnp.arrays(np.float64, m, elements=doubles)), chunks,
                           draw(doubles), draw(doubles), draw(residuals))


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))


def _check_aligned(a: at.AlignedTrace, b: at.AlignedTrace) -> None:
    assert _same(a.target_token_ids, b.target_token_ids)
    assert _same(a.target_offsets, b.target_offsets)
    assert _same(a.target_values, b.target_values)
    for name in ("char_start", "char_end", "source_start", "source_end", "target_start",
                 "target_end", "value", "clean"):
        assert _same(getattr(a.chunks, name), getattr(b.chunks, name)), name
    assert _same(np.array([a.sequence_value, a.mass_error]),
                 np.array([b.sequence_value, b.mass_error]))
    assert a.residual == b.residual


@settings(max_examples=150, deadline=None)
@given(items=st.lists(tokenized(), max_size=4))
def test_tokenized_texts_parse_back_as_written(items: list[at.TokenizedText]) -> None:
    data = wire.retokenize_response_bytes([wire.tokenized_bytes(t) for t in items])
    back = [wire.tokenized_from_pb(m) for m in pb.RetokenizeResponse.FromString(data).results]
    assert len(back) == len(items)
    for t, b in zip(items, back, strict=True):
        assert _same(t.token_ids, b.token_ids) and _same(t.offsets, b.offsets)
        assert t.text == b.text and t.residual == b.residual


@settings(max_examples=150, deadline=None)
@given(items=st.lists(aligned(), max_size=3), residual=residuals)
def test_aligned_traces_parse_back_as_written(items: list[at.AlignedTrace],
                                             residual: at.Residual) -> None:
    data = wire.result_bytes(at.AlignTraceResult(items, residual))
    back = wire.result_from_pb(pb.AlignTraceResponse.FromString(data))
    assert back.residual == residual and len(back.results) == len(items)
    for a, b in zip(items, back.results, strict=True):
        _check_aligned(a, b)


@pytest.mark.parametrize("target", ["byte_bpe", "wordpiece", "unigram", "char",
                                    "byte_bpe_special"])
def test_real_alignments_parse_back_as_computed(target: str) -> None:
    paths = trained_tokenizers()
    engine = AlignmentEngine()
    engine.register("src", paths["byte_bpe"])
    engine.register("tgt", paths[target])
    texts = ["Hello wörld 🎉 the quick fox", "", "a" * 3000, "日本語 テスト\n\tx",
             "\U0001f389" * 300]
    src = engine.retokenize("src", texts)
    items = [at.TraceItem(t, r.token_ids, np.linspace(-3.0, 0.0, len(r.token_ids)), r.offsets)
             for t, r in zip(texts, src, strict=True)]
    for mode, placement in (("chunk", "last"), ("chunk", "spread"), ("sequence", "last")):
        result = engine.align_trace("src", "tgt", items, mode, placement)  # type: ignore[arg-type]
        back = wire.result_from_pb(pb.AlignTraceResponse.FromString(wire.result_bytes(result)))
        for a, b in zip(result.results, back.results, strict=True):
            _check_aligned(a, b)
    tok = engine.retokenize("tgt", texts, add_special_tokens=True)
    data = wire.retokenize_response_bytes([wire.tokenized_bytes(t) for t in tok])
    for t, m in zip(tok, pb.RetokenizeResponse.FromString(data).results, strict=True):
        b = wire.tokenized_from_pb(m)
        assert _same(t.token_ids, b.token_ids) and _same(t.offsets, b.offsets)


def test_long_encodings_are_read_in_pieces_as_a_whole() -> None:
    """`token_arrays` splits an Encoding into pieces; the arrays are the whole encoding's,
    special tokens (BOS/EOS of a post-processor) included."""
    from tokenizers import Tokenizer

    from mutualrl.thl.engine import ENCODING_PIECE, token_arrays

    for name in ("byte_bpe", "byte_bpe_special", "wordpiece"):
        tok = Tokenizer.from_file(f"{trained_tokenizers()[name]}/tokenizer.json")
        text = "héllo 🎉 wörld " * (ENCODING_PIECE // 8)
        whole = tok.encode(text)
        ids, offsets, special = token_arrays(tok.encode(text))
        assert ENCODING_PIECE < len(whole.ids) < 3 * ENCODING_PIECE
        assert np.array_equal(ids, np.asarray(whole.ids))
        assert np.array_equal(offsets, np.asarray(whole.offsets))
        assert np.array_equal(special, np.asarray(whole.special_tokens_mask, dtype=bool))
