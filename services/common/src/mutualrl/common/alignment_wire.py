"""Conversions between THL's plain types and its protobuf messages (both directions).

Shared by the servicer and the clients so both ends agree on one mapping.
"""

from __future__ import annotations

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


def _offsets(starts: object, ends: object) -> np.ndarray:
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    return np.stack([s, e], axis=1) if s.shape[0] else np.zeros((0, 2), dtype=np.int64)


def tokenized_to_pb(t: at.TokenizedText) -> pb.TokenizedText:
    return pb.TokenizedText(token_ids=t.token_ids.tolist(),
                            offset_starts=t.offsets[:, 0].tolist(),
                            offset_ends=t.offsets[:, 1].tolist(), text=t.text,
                            residual=residual_to_pb(t.residual))


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
    return at.TraceItem(text=msg.text, source_token_ids=np.asarray(msg.source_token_ids,
                                                                dtype=np.int64),
                     values=np.asarray(msg.values, dtype=np.float64), source_offsets=offsets)


def aligned_to_pb(a: at.AlignedTrace) -> pb.AlignedTrace:
    c = a.chunks
    chunks = [pb.Chunk(char_start=cs, char_end=ce, source_start=ss, source_end=se,
                       target_start=ts, target_end=te, value=v, one_to_one=o)
              for cs, ce, ss, se, ts, te, v, o in zip(
                  c.char_start.tolist(), c.char_end.tolist(), c.source_start.tolist(),
                  c.source_end.tolist(), c.target_start.tolist(), c.target_end.tolist(),
                  c.value.tolist(), c.clean.tolist(), strict=True)]
    return pb.AlignedTrace(target_token_ids=a.target_token_ids.tolist(),
                           target_offset_starts=a.target_offsets[:, 0].tolist(),
                           target_offset_ends=a.target_offsets[:, 1].tolist(),
                           target_values=a.target_values.tolist(), chunks=chunks,
                           sequence_value=a.sequence_value, residual=residual_to_pb(a.residual),
                           mass_error=a.mass_error)


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


def result_to_pb(r: at.AlignTraceResult) -> pb.AlignTraceResponse:
    return pb.AlignTraceResponse(results=[aligned_to_pb(a) for a in r.results],
                                 residual=residual_to_pb(r.residual))


def result_from_pb(msg: pb.AlignTraceResponse) -> at.AlignTraceResult:
    return at.AlignTraceResult([aligned_from_pb(a) for a in msg.results],
                            residual_from_pb(msg.residual))
