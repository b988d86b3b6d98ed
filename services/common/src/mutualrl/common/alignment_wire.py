"""Conversions between THL's plain types and its protobuf messages (both directions).

Shared by the servicer and the clients so both ends agree on one mapping. The servicer writes
its two large answers (RetokenizeResponse, AlignTraceResponse) as wire bytes straight from
numpy (`tokenized_bytes`, `result_bytes`), and clients parse them as the generated messages
(`tokenized_from_pb`, `result_from_pb`). Why by hand: building the messages field by field made
a Python object per chunk and a Python int per token (7 s and ~100 bytes a token for a 1 MiB
text); here a token costs its varints and a block of chunks a few numpy arrays, so an answer's
memory is its wire size. The encoding is protobuf's (varints, packed repeated fields,
length-delimited messages; every field written, zeros too, which parsers accept);
tests/unit/test_thl_wire.py holds it equal to the generated messages' content.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from mutualrl.common import alignment_types as at
from mutualrl.v1 import alignment_pb2 as pb

MODE_TO_PB = {"chunk": pb.ALIGN_MODE_CHUNK, "sequence": pb.ALIGN_MODE_SEQUENCE}
PLACEMENT_TO_PB = {"last": pb.PLACEMENT_LAST, "spread": pb.PLACEMENT_SPREAD}
MODE_FROM_PB: dict[int, at.Mode] = {pb.ALIGN_MODE_UNSPECIFIED: "chunk",
                                 pb.ALIGN_MODE_CHUNK: "chunk",
                                 pb.ALIGN_MODE_SEQUENCE: "sequence"}
PLACEMENT_FROM_PB: dict[int, at.Placement] = {pb.PLACEMENT_UNSPECIFIED: "last",
                                           pb.PLACEMENT_LAST: "last",
                                           pb.PLACEMENT_SPREAD: "spread"}


def info_to_pb(info: at.TokenizerInfo) -> pb.TokenizerInfo:
    return pb.TokenizerInfo(tokenizer_id=info.tokenizer_id, path=info.path,
                            model_type=info.model_type, vocab_size=info.vocab_size,
                            byte_level=info.byte_level, normalizer=info.normalizer)


def info_from_pb(msg: pb.TokenizerInfo) -> at.TokenizerInfo:
    return at.TokenizerInfo(tokenizer_id=msg.tokenizer_id, path=msg.path, model_type=msg.model_type,
                         vocab_size=msg.vocab_size, byte_level=msg.byte_level,
                         normalizer=msg.normalizer)


def residual_to_pb(r: at.Residual) -> pb.Residual:
    return pb.Residual(roundtrip_mismatch_chars=r.roundtrip_mismatch_chars,
                       multi_token_chunk_share=r.multi_token_chunk_share,
                       uncovered_bytes=r.uncovered_bytes,
                       normalized_changed_chars=r.normalized_changed_chars)


def residual_from_pb(msg: pb.Residual) -> at.Residual:
    return at.Residual(roundtrip_mismatch_chars=msg.roundtrip_mismatch_chars,
                    multi_token_chunk_share=msg.multi_token_chunk_share,
                    uncovered_bytes=msg.uncovered_bytes,
                    normalized_changed_chars=msg.normalized_changed_chars)


def _array(values: Sequence[float], dtype: type) -> np.ndarray:
    """A repeated field as a numpy array, element by element: `np.asarray` of a protobuf
    container first builds a Python list of it (~40 bytes an element more)."""
    return np.fromiter(values, dtype=dtype, count=len(values))


def _offsets(starts: Sequence[int], ends: Sequence[int]) -> np.ndarray:
    n = len(starts)
    out = np.empty((n, 2), dtype=np.int64)
    out[:, 0] = _array(starts, np.int64)
    out[:, 1] = _array(ends, np.int64)
    return out


# ---- wire bytes ----------------------------------------------------------------------------

_BLOCK = 1 << 16
"""Values (or chunks) encoded per numpy pass: the temporaries stay a few MB."""


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # a negative int32/int64 is ten bytes of two's complement
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _varint_columns(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each value's varint as a row of a (n, width) uint8 array, and how many bytes of each
    row it takes."""
    v = np.asarray(values).astype(np.int64, copy=False).view(np.uint64)
    n = np.ones(v.shape[0], dtype=np.int64)
    for k in range(1, 10):
        n += v >= np.uint64(1 << (7 * k))
    width = int(n.max()) if v.shape[0] else 1
    cols = np.empty((v.shape[0], width), dtype=np.uint8)
    for k in range(width):
        cols[:, k] = ((v >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8) | (
            (n > k + 1).astype(np.uint8) << 7)
    return cols, n


def _packed_varints(values: np.ndarray) -> bytes:
    """The varints of `values`, one after another (a packed repeated int field's payload)."""
    parts = []
    for lo in range(0, values.shape[0], _BLOCK):
        cols, n = _varint_columns(values[lo:lo + _BLOCK])
        parts.append(cols[np.arange(cols.shape[1]) < n[:, None]].tobytes())
    return b"".join(parts)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (a message, a string, a packed array)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _double(number: int, value: float) -> bytes:
    return _varint(number << 3 | 1) + np.float64(value).tobytes()


def tokenized_bytes(t: at.TokenizedText) -> bytes:
    """A TokenizedText on the wire (what `tokenized_from_pb` reads)."""
    return b"".join((
        _field(1, _packed_varints(t.token_ids)),
        _field(2, _packed_varints(t.offsets[:, 0])),
        _field(3, _packed_varints(t.offsets[:, 1])),
        _field(4, t.text.encode("utf-8")),
        _field(5, residual_to_pb(t.residual).SerializeToString())))


def retokenize_response_bytes(results: list[bytes]) -> bytes:
    """A RetokenizeResponse of TokenizedTexts already on the wire (`tokenized_bytes`)."""
    return b"".join(_field(1, r) for r in results)


# Chunk's fields: six int32 (1-6), the value (7, double), one_to_one (8, bool).
_CHUNK_INT_TAGS = tuple(n << 3 for n in range(1, 7))


def _chunk_rows(c: at.Chunks, lo: int, hi: int) -> bytes:
    """Chunks [lo, hi) as repeated field 5 of an AlignedTrace: each a tag, a length and the
    chunk's fields, built as the columns of one uint8 matrix (width 49) and masked."""
    n = hi - lo
    ints = (c.char_start, c.char_end, c.source_start, c.source_end, c.target_start,
            c.target_end)
    cols = [np.full((n, 1), 5 << 3 | 2, dtype=np.uint8), np.zeros((n, 1), dtype=np.uint8)]
    used = [np.ones(n, dtype=np.int64), np.ones(n, dtype=np.int64)]
    for tag, arr in zip(_CHUNK_INT_TAGS, ints, strict=True):
        body, length = _varint_columns(arr[lo:hi])
        cols += [np.full((n, 1), tag, dtype=np.uint8), body]
        used += [np.ones(n, dtype=np.int64), length]
    cols += [np.full((n, 1), 7 << 3 | 1, dtype=np.uint8),
             np.ascontiguousarray(c.value[lo:hi], dtype="<f8").view(np.uint8).reshape(n, 8),
             np.full((n, 1), 8 << 3, dtype=np.uint8),
             c.clean[lo:hi].astype(np.uint8).reshape(n, 1)]
    used += [np.ones(n, dtype=np.int64), np.full(n, 8), np.ones(n, dtype=np.int64),
             np.ones(n, dtype=np.int64)]
    matrix = np.concatenate(cols, axis=1)
    widths = np.array([col.shape[1] for col in cols])
    # Each column group's bytes in use, spread over its columns.
    starts = np.concatenate(([0], np.cumsum(widths)[:-1]))
    mask = np.zeros(matrix.shape, dtype=bool)
    for start, width, k in zip(starts, widths, used, strict=True):
        mask[:, start:start + width] = np.arange(width) < k[:, None]
    matrix[:, 1] = mask.sum(axis=1) - 2  # a chunk is at most 47 bytes: a one-byte length
    return matrix[mask].tobytes()


def aligned_bytes(a: at.AlignedTrace) -> bytes:
    """An AlignedTrace on the wire (what `aligned_from_pb` reads)."""
    n = a.chunks.char_start.shape[0]
    return b"".join((
        _field(1, _packed_varints(a.target_token_ids)),
        _field(2, _packed_varints(a.target_offsets[:, 0])),
        _field(3, _packed_varints(a.target_offsets[:, 1])),
        _field(4, np.ascontiguousarray(a.target_values, dtype="<f8").tobytes()),
        *(_chunk_rows(a.chunks, lo, min(lo + _BLOCK, n)) for lo in range(0, n, _BLOCK)),
        _double(6, a.sequence_value),
        _field(7, residual_to_pb(a.residual).SerializeToString()),
        _double(8, a.mass_error)))


def align_response_bytes(results: list[bytes], residual: at.Residual) -> bytes:
    """An AlignTraceResponse of AlignedTraces already on the wire (`aligned_bytes`)."""
    return b"".join((*(_field(1, r) for r in results),
                     _field(2, residual_to_pb(residual).SerializeToString())))


def tokenized_from_pb(msg: pb.TokenizedText) -> at.TokenizedText:
    return at.TokenizedText(np.asarray(msg.token_ids, dtype=np.int64),
                         _offsets(msg.offset_starts, msg.offset_ends), msg.text,
                         residual_from_pb(msg.residual))


def item_to_pb(it: at.TraceItem) -> pb.TraceItem:
    msg = pb.TraceItem(text=it.text,
                       source_token_ids=np.asarray(it.source_token_ids, dtype=np.int64).tolist(),
                       values=np.asarray(it.values, dtype=np.float64).tolist())
    if it.source_offsets is not None:
        off = np.asarray(it.source_offsets, dtype=np.int64).reshape(-1, 2)
        msg.source_offset_starts.extend(off[:, 0].tolist())
        msg.source_offset_ends.extend(off[:, 1].tolist())
    return msg


def item_from_pb(msg: pb.TraceItem, index: int) -> at.TraceItem:
    """A TraceItem from the wire; mismatched offset arrays are reported by the engine."""
    from mutualrl.common.errors import InvalidArgument

    n_s, n_e = len(msg.source_offset_starts), len(msg.source_offset_ends)
    if n_s != n_e:
        raise InvalidArgument(f"items[{index}].source_offset_ends",
                              f"{n_e} ends for {n_s} starts")
    offsets = _offsets(msg.source_offset_starts, msg.source_offset_ends) if n_s else None
    return at.TraceItem(text=msg.text, source_token_ids=_array(msg.source_token_ids, np.int64),
                        values=_array(msg.values, np.float64), source_offsets=offsets)


def aligned_from_pb(msg: pb.AlignedTrace) -> at.AlignedTrace:
    n = len(msg.chunks)
    cols = np.zeros((6, n), dtype=np.int64)
    vals = np.zeros(n, dtype=np.float64)
    clean = np.zeros(n, dtype=bool)
    for j, ch in enumerate(msg.chunks):
        cols[:, j] = (ch.char_start, ch.char_end, ch.source_start, ch.source_end,
                      ch.target_start, ch.target_end)
        vals[j] = ch.value
        clean[j] = ch.one_to_one
    chunks = at.Chunks(cols[0], cols[1], cols[2], cols[3], cols[4], cols[5], vals, clean)
    return at.AlignedTrace(np.asarray(msg.target_token_ids, dtype=np.int64),
                        _offsets(msg.target_offset_starts, msg.target_offset_ends),
                        np.asarray(msg.target_values, dtype=np.float64), chunks,
                        msg.sequence_value, msg.mass_error, residual_from_pb(msg.residual))


def result_bytes(r: at.AlignTraceResult) -> bytes:
    """An AlignTraceResponse on the wire (what `result_from_pb` reads)."""
    return align_response_bytes([aligned_bytes(a) for a in r.results], r.residual)


def result_from_pb(msg: pb.AlignTraceResponse) -> at.AlignTraceResult:
    return at.AlignTraceResult([aligned_from_pb(a) for a in msg.results],
                            residual_from_pb(msg.residual))
