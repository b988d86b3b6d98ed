"""Plain data of the Alignment contract (THL), shared by THL and its clients (no network code).

`AlignmentEngine` (in-process) and `ThlClient` / `AsyncThlClient` (over gRPC) take and return
exactly these types, so a trainer can switch between them without touching its code.
Offsets are character (code point) offsets into the item's text, end exclusive.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

Mode = Literal["chunk", "sequence"]
Placement = Literal["last", "spread"]
IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float64]


@dataclass(frozen=True)
class Chunks:
    """Chunks of one item (or of a batch laid end to end); parallel int64/float64 arrays."""

    char_start: IntArray
    char_end: IntArray
    source_start: IntArray
    source_end: IntArray
    target_start: IntArray
    target_end: IntArray
    value: FloatArray
    clean: NDArray[np.bool_]
    """True when the chunk's tokens pair one-to-one (none on either side, one and one, or equal
    counts with identical offsets); the multi-token residual counts the others."""

    def __len__(self) -> int:
        return int(self.char_start.shape[0])

    def slice(self, lo: int, hi: int) -> Chunks:
        return Chunks(*(getattr(self, f)[lo:hi] for f in _CHUNK_FIELDS))

    def shifted(self, char: int, source: int, target: int) -> Chunks:
        """The same chunks with offsets made relative to an item's origin."""
        return Chunks(self.char_start - char, self.char_end - char, self.source_start - source,
                      self.source_end - source, self.target_start - target,
                      self.target_end - target, self.value, self.clean)


_CHUNK_FIELDS = ("char_start", "char_end", "source_start", "source_end", "target_start",
                 "target_end", "value", "clean")


@dataclass(frozen=True)
class TokenizerInfo:
    """A registered tokenizer."""

    tokenizer_id: str
    path: str
    model_type: str
    """"BPE", "WordPiece", "Unigram" or "WordLevel"."""
    vocab_size: int
    """Number of ids including added/special tokens."""
    byte_level: bool
    """True when the tokenizer works on bytes (byte-level BPE)."""
    normalizer: str
    """Normalizer kind ("" when none), e.g. "BertNormalizer", "NFKC"."""


@dataclass(frozen=True)
class Residual:
    """How much of a retokenization or alignment is not clean (all zero when perfect)."""

    roundtrip_mismatch_chars: int = 0
    """Edit distance between the text and decode(encode(text)) through the target tokenizer."""
    multi_token_chunk_share: float = 0.0
    """Share of target tokens in chunks whose tokens do not pair one-to-one (alignments only)."""
    uncovered_bytes: int = 0
    """UTF-8 bytes of the text covered by no target token."""
    normalized_changed_chars: int = 0
    """Edit distance between the text and the target normalizer's output (lower-casing, NFKC)."""


@dataclass(frozen=True)
class TokenizedText:
    """One text encoded by one tokenizer."""

    token_ids: NDArray[np.int64]
    offsets: NDArray[np.int64]
    """(n, 2) character offsets into `text`; special tokens get (0, 0)."""
    text: str
    """The text the offsets refer to (the input, or the chat-templated input)."""
    residual: Residual = field(default_factory=Residual)


@dataclass(frozen=True)
class TraceItem:
    """One source trace to move to the target tokenizer."""

    text: str
    source_token_ids: Sequence[int] | NDArray[np.int64]
    values: Sequence[float] | NDArray[np.float64]
    """One finite value per source token (e.g. behaviour log-probs)."""
    source_offsets: ArrayLike | None = None
    """(n, 2) source offsets; None: THL re-encodes `text` (the ids must then match)."""


@dataclass(frozen=True)
class AlignedTrace:
    """One trace in the target tokenizer's tokens."""

    target_token_ids: NDArray[np.int64]
    target_offsets: NDArray[np.int64]
    target_values: NDArray[np.float64]
    """One value per target token (placement applied; the sequence value in sequence mode)."""
    chunks: Chunks
    """Chunk spans relative to this item (char range, source and target token ranges, value)."""
    sequence_value: float
    """sum(values) / number of source tokens (0 when there are none)."""
    mass_error: float
    """Exact sum(chunk values) - sum(values); 0.0 unless a chunk sum is not a float64."""
    residual: Residual


@dataclass(frozen=True)
class AlignTraceResult:
    """A batch of aligned traces and the batch's residual (counts summed; the share is the
    share of all target tokens of the batch)."""

    results: list[AlignedTrace]
    residual: Residual


def aggregate_residual(residuals: Sequence[Residual], target_tokens: Sequence[int]) -> Residual:
    """Batch residual: counts summed, multi-token share weighted by each item's target tokens."""
    total_tokens = sum(target_tokens)
    share = (sum(r.multi_token_chunk_share * n for r, n in zip(residuals, target_tokens,
                                                                strict=True)) / total_tokens
             if total_tokens else 0.0)
    return Residual(
        roundtrip_mismatch_chars=sum(r.roundtrip_mismatch_chars for r in residuals),
        multi_token_chunk_share=share,
        uncovered_bytes=sum(r.uncovered_bytes for r in residuals),
        normalized_changed_chars=sum(r.normalized_changed_chars for r in residuals),
    )
