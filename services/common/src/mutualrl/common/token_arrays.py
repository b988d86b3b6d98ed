"""Per-token arrays of an ExperienceRecord (experience.proto, contract version 2).

Token ids and offsets travel as little-endian int32 bytes, log-probs as little-endian float32
bytes. Readers get zero-copy numpy views (`np.frombuffer`) instead of converting a repeated field
element by element; writers pack a whole array with one `tobytes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mutualrl.v1 import experience_pb2 as pb

I32 = np.dtype("<i4")
F32 = np.dtype("<f4")
# (field of ExperienceRecord, element type), in the proto's order.
FIELDS: tuple[tuple[str, np.dtype[Any]], ...] = (
    ("token_ids_i32", I32), ("offset_starts_i32", I32), ("offset_ends_i32", I32),
    ("logprobs_f32", F32))


def pack_i32(values: Sequence[int] | np.ndarray) -> bytes:
    return np.asarray(values, dtype=I32).tobytes()


def pack_f32(values: Sequence[float] | np.ndarray) -> bytes:
    return np.asarray(values, dtype=F32).tobytes()


def set_tokens(rec: pb.ExperienceRecord, token_ids: Sequence[int] | np.ndarray,
               offset_starts: Sequence[int] | np.ndarray, offset_ends: Sequence[int] | np.ndarray,
               logprobs: Sequence[float] | np.ndarray) -> pb.ExperienceRecord:
    """Write the four arrays into `rec` (returned for chaining)."""
    rec.token_ids_i32 = pack_i32(token_ids)
    rec.offset_starts_i32 = pack_i32(offset_starts)
    rec.offset_ends_i32 = pack_i32(offset_ends)
    rec.logprobs_f32 = pack_f32(logprobs)
    return rec


def _view(data: bytes, dtype: np.dtype[Any]) -> np.ndarray:
    # A trailing partial element is a malformed record; SEE refuses it at Publish, so a stored
    # record never has one. Ignore it rather than raise in readers.
    n = len(data) // dtype.itemsize
    return np.frombuffer(data, dtype=dtype, count=n)


def token_ids(rec: pb.ExperienceRecord) -> np.ndarray:
    """Token ids (int32 view, read-only)."""
    return _view(rec.token_ids_i32, I32)


def offset_starts(rec: pb.ExperienceRecord) -> np.ndarray:
    return _view(rec.offset_starts_i32, I32)


def offset_ends(rec: pb.ExperienceRecord) -> np.ndarray:
    return _view(rec.offset_ends_i32, I32)


def logprobs(rec: pb.ExperienceRecord) -> np.ndarray:
    """Behaviour log-probs (float32 view, read-only)."""
    return _view(rec.logprobs_f32, F32)


def n_tokens(rec: pb.ExperienceRecord) -> int:
    return len(rec.token_ids_i32) // I32.itemsize
