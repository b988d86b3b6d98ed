"""`AlignmentEngine`: THL in-process, with the same interface as `ThlClient`.

The gRPC servicer is a thin shell over this class, and trainers that run without the service
use it directly, so both go through the same code: validation, tokenization, the pure
alignment core (`mutualrl.thl.align`) and the residual metrics (`mutualrl.thl.residual`).
Errors are `mutualrl.common.errors` exceptions naming the offending field.
"""

from __future__ import annotations

import builtins  # the classes below define a `list` method
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mutualrl.common.alignment_types import (
    AlignedTrace,
    AlignTraceResult,
    Mode,
    Placement,
    Residual,
    TokenizedText,
    TokenizerInfo,
    TraceItem,
    aggregate_residual,
)
from mutualrl.common.errors import FailedPrecondition, InvalidArgument, ResourceExhausted, quote
from mutualrl.thl import align as core
from mutualrl.thl.registry import LoadedTokenizer, TokenizerRegistry
from mutualrl.thl.residual import edit_distance, uncovered_bytes

MODES = ("chunk", "sequence")
PLACEMENTS = ("last", "spread")


@dataclass(frozen=True)
class EngineLimits:
    """Request limits (the servicer's config passes its own)."""

    max_batch: int = 1024
    """Most texts / items in one call."""
    max_text_bytes: int = 1 << 20
    """Largest text in UTF-8 bytes."""
    max_request_text_bytes: int | None = None
    """Most UTF-8 bytes of text in one call, all texts / items together (the work and the
    memory a call takes grow with it); None: no limit (a trainer's in-process engine; the
    service passes `thl.max_request_text_bytes`)."""
    align_block_items: int = 64
    """Items aligned per vectorised pass (keeps the working set in cache)."""
    max_response_bytes: int | None = 64 * 1024 * 1024
    """Largest response a call may produce (the server's max message size); None: no limit."""


# A tokenizer never makes more tokens of a text than the text has UTF-8 bytes (byte-level BPE
# and byte fallback reach one per byte), plus the special tokens a template or post-processor
# adds; this slack covers those.
_SPECIAL_TOKENS_SLACK = 16
# Per TokenizedText: the tags and lengths of its fields and a Residual (4 fields of <= 11 bytes).
_TOKENIZED_OVERHEAD = 96
# Per AlignedTrace: as above plus sequence_value and mass_error (9 bytes each) and the tags and
# lengths of its four packed arrays and of its chunk list.
_ALIGNED_OVERHEAD = 160
# Per Chunk beyond its six int fields: value (9), one_to_one (2), its tag and length (<= 4).
_CHUNK_OVERHEAD = 15
# Source tokens an item may carry per UTF-8 byte of its text (plus the special-token slack): a
# tokenizer makes at most one per byte unless its normalizer expands text (NFKC), never this
# many; more is not a token trace of that text.
MAX_SOURCE_TOKENS_PER_BYTE = 4


# Text encoded per tokenizer call: a tokenizer's Encoding holds ~130 bytes per token (ids, type
# ids, the token strings, offsets, masks, word ids), so only this much text's worth is alive
# at once (a single larger text goes alone).
ENCODE_BLOCK_BYTES = 256 * 1024


def encode_blocks(texts: Sequence[str], max_items: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges of `texts` with at most `max_items` texts and, unless one text alone is
    larger, at most ENCODE_BLOCK_BYTES of UTF-8 each."""
    out: list[tuple[int, int]] = []
    lo, size = 0, 0
    for i, text in enumerate(texts):
        n = len(text.encode("utf-8"))
        if i > lo and (i - lo >= max_items or size + n > ENCODE_BLOCK_BYTES):
            out.append((lo, i))
            lo, size = i, 0
        size += n
    if lo < len(texts):
        out.append((lo, len(texts)))
    return out


def _varint_bytes(n: int) -> int:
    return max(1, (max(n, 1).bit_length() + 6) // 7)


def retokenize_response_bound(texts: Sequence[str], vocab_size: int) -> int:
    """An upper bound on the serialized RetokenizeResponse for `texts`, from their sizes alone:
    the text echoed back, and per token an id and two offsets at most one token per byte."""
    total = 0
    id_bytes = _varint_bytes(vocab_size)
    for text in texts:
        size = len(text.encode("utf-8"))
        tokens = size + _SPECIAL_TOKENS_SLACK
        per_token = id_bytes + 2 * _varint_bytes(len(text))
        total += size + tokens * per_token + _TOKENIZED_OVERHEAD
    return total


def align_response_bound(items: Sequence[TraceItem], target_tokens: Sequence[int],
                         vocab_size: int) -> int:
    """An upper bound on the serialized AlignTraceResponse for `items`, whose texts the target
    tokenizer encodes to `target_tokens` tokens each: per target token an id, two offsets and
    a double; per chunk six ints, a double and a bool. Chunks end on distinct character
    positions and on a cut of each side, so an item has at most min(its characters, source
    tokens + target tokens + 1) of them (and at least one)."""
    total = _TOKENIZED_OVERHEAD  # the batch residual
    id_bytes = _varint_bytes(vocab_size)
    for it, m in zip(items, target_tokens, strict=True):
        chars = len(it.text)
        n = int(np.asarray(it.source_token_ids).size)
        per_token = id_bytes + 2 * _varint_bytes(chars) + 8
        chunks = max(1, min(chars, n + m + 1))
        per_chunk = 2 * (3 + _varint_bytes(chars) + _varint_bytes(n) + _varint_bytes(m))
        total += m * per_token + chunks * (per_chunk + _CHUNK_OVERHEAD) + _ALIGNED_OVERHEAD
    return total


def _check_text(text: Any, field: str, limit: int) -> None:
    if not isinstance(text, str):
        raise InvalidArgument(field, f"must be a string, got {type(text).__name__}")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as err:
        raise InvalidArgument(field, f"is not valid Unicode text ({err.reason} at "
                              f"character {err.start})") from err
    if size > limit:
        raise InvalidArgument(field, f"is {size} bytes of UTF-8, over the {limit}-byte limit")


class AlignmentEngine:
    """Tokenizer registry + retokenization + trace alignment, in-process."""

    def __init__(self, registry: TokenizerRegistry | None = None,
                 limits: EngineLimits | None = None) -> None:
        self.registry = registry if registry is not None else TokenizerRegistry()
        self.limits = limits or EngineLimits()

    # -- registry -------------------------------------------------------------------------
    def register(self, tokenizer_id: str, path: str, overwrite: bool = False,
                 run_id: str = "") -> TokenizerInfo:
        """Register (or confirm) a fast tokenizer at a local path under `tokenizer_id`; for
        `run_id` when given (`delete_run` releases it). The path must lie under the registry's
        roots (when it has any)."""
        return self.registry.register(tokenizer_id, path, overwrite, run_id)

    def delete_run(self, run_id: str) -> int:
        """Release the registrations made for `run_id`; returns how many it held."""
        return self.registry.delete_run(run_id)

    def list(self) -> list[TokenizerInfo]:
        """Every registered tokenizer, sorted by id."""
        return self.registry.list()

    # -- retokenize -----------------------------------------------------------------------
    def retokenize(self, tokenizer_id: str, texts: Sequence[str], add_special_tokens: bool = False,
                   apply_chat_template: bool = False) -> builtins.list[TokenizedText]:
        """Encode texts with a registered tokenizer: ids, char offsets and residual metrics."""
        tok = self.registry.get(tokenizer_id)
        self.check_texts(texts, "texts")
        if apply_chat_template:
            if not getattr(tok.hf, "chat_template", None):
                raise FailedPrecondition("apply_chat_template",
                                         f"tokenizer {quote(tokenizer_id)} has no chat template")
            texts = [tok.hf.apply_chat_template([{"role": "user", "content": t}],
                                                tokenize=False) for t in texts]
        self._check_response("texts", retokenize_response_bound(texts, tok.info.vocab_size),
                             texts)
        out = []
        for lo, hi in encode_blocks(texts, max(1, self.limits.align_block_items)):
            part = list(texts[lo:hi])
            encs = tok.backend.encode_batch(part, add_special_tokens=add_special_tokens)
            for text, enc in zip(part, encs, strict=True):
                ids = np.asarray(enc.ids, dtype=np.int64)
                offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(-1, 2)
                special = np.asarray(enc.special_tokens_mask, dtype=bool)
                out.append(TokenizedText(ids, offsets, text,
                                         self._residual(tok, text, ids, offsets, special)))
            del encs
        return out

    # -- align ----------------------------------------------------------------------------
    def align_trace(self, source_tokenizer_id: str, target_tokenizer_id: str,
                    items: Sequence[TraceItem], mode: Mode = "chunk",
                    placement: Placement = "last") -> AlignTraceResult:
        """Move source token traces onto the target tokenizer's tokens (see `align`)."""
        if mode not in MODES:
            raise InvalidArgument("mode", f"{quote(mode)} is not one of {MODES}")
        if placement not in PLACEMENTS:
            raise InvalidArgument("placement", f"{quote(placement)} is not one of {PLACEMENTS}")
        src = self.registry.get(source_tokenizer_id, "source_tokenizer_id")
        tgt = self.registry.get(target_tokenizer_id, "target_tokenizer_id")
        texts = [it.text for it in items]
        self.check_texts(texts, "items")
        for i, it in enumerate(items):
            n_source = int(np.asarray(it.source_token_ids).size)
            most = MAX_SOURCE_TOKENS_PER_BYTE * len(it.text.encode("utf-8")) + _SPECIAL_TOKENS_SLACK
            if n_source > most:
                raise InvalidArgument(f"items[{i}].source_token_ids",
                                      f"{n_source} tokens for a text of {len(it.text)} "
                                      f"characters; at most {most} can be its tokens")
        tgt_ids: list[np.ndarray] = []
        tgt_offsets: list[np.ndarray] = []
        for lo, hi in encode_blocks(texts, max(1, self.limits.align_block_items)):
            encs = tgt.backend.encode_batch(texts[lo:hi], add_special_tokens=False)
            tgt_ids += [np.asarray(e.ids, dtype=np.int64) for e in encs]
            tgt_offsets += [np.asarray(e.offsets, dtype=np.int64).reshape(-1, 2) for e in encs]
            del encs
        # Once the target's token counts are known (encoding is the cheap part), before the
        # source side, the alignment and the answer are built.
        self._check_response("items", align_response_bound(
            items, [len(t) for t in tgt_ids], tgt.info.vocab_size), texts)
        src_offsets, values = self._source_side(src, items)
        results: list[AlignedTrace] = []
        block = max(1, self.limits.align_block_items)
        for lo in range(0, len(items), block):
            hi = min(lo + block, len(items))
            s_st, s_en, s_b = core.concat_offsets(src_offsets[lo:hi])
            t_st, t_en, t_b = core.concat_offsets(tgt_offsets[lo:hi])
            vals = (np.concatenate(values[lo:hi]) if hi > lo else np.zeros(0))
            lengths = np.array([len(t) for t in texts[lo:hi]], dtype=np.int64)
            batch = core.align_batch(lengths, s_st, s_en, s_b, t_st, t_en, t_b, vals,
                                     mode=mode, placement=placement)
            for j in range(hi - lo):
                i = lo + j
                item = batch.item(j)
                residual = self._residual(tgt, texts[i], tgt_ids[i], tgt_offsets[i],
                                          np.zeros(len(tgt_ids[i]), dtype=bool),
                                          item.multi_token_chunk_share)
                results.append(AlignedTrace(tgt_ids[i], tgt_offsets[i], item.target_values,
                                            item.chunks, item.sequence_value, item.mass_error,
                                            residual))
        agg = aggregate_residual([r.residual for r in results],
                                 [len(r.target_token_ids) for r in results])
        return AlignTraceResult(results, agg)

    # -- helpers --------------------------------------------------------------------------
    def check_texts(self, texts: Sequence[str], field: str) -> None:
        """The limits on a call's texts (`field`: "texts", or "items" whose entries' `.text`
        they are): how many, each one's size and validity, and their total size."""
        self._check_batch(texts, field)
        entry = "{field}[{i}]" if field == "texts" else "{field}[{i}].text"
        for i, text in enumerate(texts):
            _check_text(text, entry.format(field=field, i=i), self.limits.max_text_bytes)
        self._check_total(texts, field)

    def _check_response(self, field: str, bound: int, texts: Sequence[str]) -> None:
        """Refuse, before any encoding, a batch whose response could exceed the message limit
        (it would fail only after all the work, with the same code)."""
        limit = self.limits.max_response_bytes
        if limit is None:
            return
        if bound > limit:
            raise ResourceExhausted(
                field, f"{len(texts)} {field} of {sum(len(t.encode('utf-8')) for t in texts)} "
                f"UTF-8 bytes of text in all could make a response of up to {bound} bytes, over "
                f"the {limit}-byte message limit; send them in smaller batches")

    def _check_total(self, texts: Sequence[str], field: str) -> None:
        limit = self.limits.max_request_text_bytes
        if limit is None:
            return
        total = sum(len(t.encode("utf-8")) for t in texts)
        if total > limit:
            raise InvalidArgument(field, f"{total} UTF-8 bytes of text in all, over the limit "
                                  f"of {limit} per call; send them in smaller batches")

    def _check_batch(self, seq: Sequence[Any], field: str) -> None:
        if len(seq) > self.limits.max_batch:
            raise InvalidArgument(field, f"{len(seq)} entries, over the limit of "
                                  f"{self.limits.max_batch} per call")

    def _source_side(self, src: LoadedTokenizer, items: Sequence[TraceItem]
                     ) -> tuple[builtins.list[np.ndarray], builtins.list[np.ndarray]]:
        """Validated source offsets and values per item (re-encoding where offsets are absent)."""
        offsets: list[np.ndarray | None] = []
        values: list[np.ndarray] = []
        need: list[int] = []
        vocab = src.info.vocab_size
        for i, it in enumerate(items):
            ids = np.asarray(it.source_token_ids, dtype=np.int64).reshape(-1)
            vals = np.asarray(it.values, dtype=np.float64).reshape(-1)
            if vals.shape[0] != ids.shape[0]:
                raise InvalidArgument(f"items[{i}].values", f"{vals.shape[0]} values for "
                                      f"{ids.shape[0]} source tokens (need one per token)")
            if not np.isfinite(vals).all():
                bad = int(np.flatnonzero(~np.isfinite(vals))[0])
                raise InvalidArgument(f"items[{i}].values", f"value {bad} is {vals[bad]}; "
                                      "values must be finite")
            if ids.shape[0] and (ids.min() < 0 or ids.max() >= vocab):
                raise InvalidArgument(f"items[{i}].source_token_ids",
                                      f"ids must lie in [0, {vocab}) for this tokenizer")
            values.append(vals)
            if it.source_offsets is None or np.asarray(it.source_offsets).size == 0:
                if ids.shape[0] == 0 and it.text == "":
                    offsets.append(np.zeros((0, 2), dtype=np.int64))
                else:
                    offsets.append(None)
                    need.append(i)
                continue
            off = np.asarray(it.source_offsets, dtype=np.int64)
            if off.ndim != 2 or off.shape[1] != 2 or off.shape[0] != ids.shape[0]:
                raise InvalidArgument(f"items[{i}].source_offsets",
                                      f"need one (start, end) per source token ({ids.shape[0]}),"
                                      f" got shape {tuple(off.shape)}")
            problem = core.validate_offsets(off[:, 0], off[:, 1], len(it.text))
            if problem:
                raise InvalidArgument(f"items[{i}].source_offsets", problem)
            offsets.append(off)
        if need:
            texts = [items[i].text for i in need]
            for lo, hi in encode_blocks(texts, max(1, self.limits.align_block_items)):
                plain = src.backend.encode_batch(texts[lo:hi], add_special_tokens=False)
                self._source_offsets(src, items, need[lo:hi], plain, offsets)
        return [o for o in offsets if o is not None], values

    @staticmethod
    def _source_offsets(src: LoadedTokenizer, items: Sequence[TraceItem],
                        need: Sequence[int], plain: Sequence[Any],
                        offsets: builtins.list[np.ndarray | None]) -> None:
        """Offsets of items[need] from their encodings `plain` (or with special tokens), which
        must carry the items' ids."""
        for i, enc in zip(need, plain, strict=True):
            ids = np.asarray(items[i].source_token_ids, dtype=np.int64).reshape(-1)
            chosen = enc if np.array_equal(ids, enc.ids) else None
            if chosen is None:
                with_special = src.backend.encode(items[i].text, add_special_tokens=True)
                if np.array_equal(ids, with_special.ids):
                    chosen = with_special
            if chosen is None:
                raise InvalidArgument(
                    f"items[{i}].source_token_ids", "without source offsets the ids must "
                    "equal the source tokenizer's encoding of text (they do not); send "
                    "source_offset_starts/ends")
            offsets[i] = np.asarray(chosen.offsets, dtype=np.int64).reshape(-1, 2)

    def _residual(self, tok: LoadedTokenizer, text: str, ids: np.ndarray, offsets: np.ndarray,
                  special: np.ndarray, multi_token_chunk_share: float = 0.0) -> Residual:
        """Round-trip, coverage and normalisation residuals of `text` under `tok`."""
        # Special tokens the tokenizer added (not text) are left out of the round trip.
        keep = ids[~special] if special.shape[0] == ids.shape[0] else ids
        # The Rust decoder directly: the transformers wrapper adds per-id Python checks and
        # clean_up_tokenization_spaces must stay off anyway (it edits the text).
        decoded = tok.backend.decode(keep.tolist(), skip_special_tokens=False)
        normalizer = tok.backend.normalizer
        normalized = normalizer.normalize_str(text) if normalizer is not None else text
        roundtrip = edit_distance(text, decoded)
        # Lower-casing tokenizers usually decode to exactly their normalised text: measure once.
        changed = roundtrip if normalized == decoded else edit_distance(text, normalized)
        return Residual(
            roundtrip_mismatch_chars=roundtrip,
            multi_token_chunk_share=float(multi_token_chunk_share),
            uncovered_bytes=uncovered_bytes(text, offsets[:, 0], offsets[:, 1]),
            normalized_changed_chars=changed,
        )

