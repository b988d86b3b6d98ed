"""`AlignmentEngine`: THL in-process, with the same interface as `ThlClient`.

The gRPC servicer is a thin shell over this class, and trainers that run without the service
use it directly, so both go through the same code: validation, tokenization, the pure
alignment core (`mutualrl.thl.align`) and the residual metrics (`mutualrl.thl.residual`).
Errors are `mutualrl.common.errors` exceptions naming the offending field.

Working memory. A call works one block of text at a time (`encode_blocks`: up to 256 KiB of
texts, or one larger text), and its results come out one item at a time (`iter_retokenize`,
`iter_align`), so the servicer writes each to the wire and drops it before the next block. A
tokenizer's Encoding holds ~170 bytes a token in Rust; its ids and offsets are read in pieces
of `ENCODING_PIECE` tokens (`token_arrays`), so the Python lists that reading makes stay small
instead of ~130 bytes a token more. What a call needs at its peak is `working_bytes`: what the
servicer's admission (`thl.max_working_bytes`) counts before it lets a call start.

Refusals. Every rule that depends on the request alone (sizes, counts, values, offsets, ids)
runs before any text is encoded; only the size of an AlignTrace answer too large to bound from
the text sizes is known after the target side is encoded (counted, not kept).
"""

from __future__ import annotations

import builtins  # the classes below define a `list` method
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mutualrl.common import memory
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


# Text encoded per tokenizer call: a tokenizer's Encoding holds ~170 bytes per token (ids, type
# ids, the token strings, offsets, masks, word ids), so only this much text's worth is alive
# at once (a single larger text goes alone).
ENCODE_BLOCK_BYTES = 256 * 1024
ENCODING_PIECE = 1 << 16
"""Tokens of an Encoding read into numpy at once (`token_arrays`)."""
WORK_BYTES_PER_TEXT_BYTE = 400
"""Working memory a call takes per UTF-8 byte of the block it encodes, at most: one token per
byte (byte-level worst case) at ~170 bytes of Encoding, its arrays, the residual's decode and
the answer's share (measured: 1 MiB of emoji, 786k tokens, peaks at ~230 MiB)."""


def token_arrays(enc: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An Encoding's ids, (n, 2) offsets and special-token mask as numpy arrays, read
    `ENCODING_PIECE` tokens at a time (`Encoding.truncate` splits it into pieces without
    copying its tokens again; the Encoding is used up)."""
    n = len(enc)
    ids = np.empty(n, dtype=np.int64)
    offsets = np.empty((n, 2), dtype=np.int64)
    special = np.empty(n, dtype=bool)
    if n > ENCODING_PIECE:
        enc.truncate(ENCODING_PIECE)
        pieces = [enc, *enc.overflowing]
    else:
        pieces = [enc]
    at = 0
    for piece in pieces:
        k = len(piece)
        ids[at:at + k] = piece.ids
        offsets[at:at + k] = np.asarray(piece.offsets, dtype=np.int64).reshape(-1, 2)
        special[at:at + k] = piece.special_tokens_mask
        at += k
    return ids, offsets, special


def encode_block(backend: Any, texts: Sequence[str], add_special_tokens: bool = False
                 ) -> builtins.list[Any]:
    """The Encodings of one block (`encode_blocks`): a block of one text is encoded alone
    (`encode`: `encode_batch` on one long text peaks ~40% higher, 200 against 140 MB for 1 MiB
    of emoji), a block of many in parallel."""
    if len(texts) == 1:
        return [backend.encode(texts[0], add_special_tokens=add_special_tokens)]
    return list(backend.encode_batch(list(texts), add_special_tokens=add_special_tokens))


def working_bytes(texts: Sequence[str]) -> int:
    """What a call over `texts` needs at its peak: its largest encode block's worth."""
    largest = max((sum(len(t.encode("utf-8")) for t in texts[lo:hi])
                   for lo, hi in encode_blocks(texts, len(texts) or 1)), default=0)
    return WORK_BYTES_PER_TEXT_BYTE * largest


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


def align_response_bound(texts: Sequence[str], source_tokens: Sequence[int],
                         target_tokens: Sequence[int], vocab_size: int) -> int:
    """An upper bound on the serialized AlignTraceResponse for items of `texts` with
    `source_tokens` tokens each, which the target tokenizer encodes to `target_tokens` tokens
    each: per target token an id, two offsets and a double; per chunk six ints, a double and a
    bool. Chunks end on distinct character positions and on a cut of each side, so an item has
    at most min(its characters, source tokens + target tokens + 1) of them (and at least
    one)."""
    total = _TOKENIZED_OVERHEAD  # the batch residual
    id_bytes = _varint_bytes(vocab_size)
    for text, n, m in zip(texts, source_tokens, target_tokens, strict=True):
        chars = len(text)
        per_token = id_bytes + 2 * _varint_bytes(chars) + 8
        chunks = max(1, min(chars, n + m + 1))
        per_chunk = 2 * (3 + _varint_bytes(chars) + _varint_bytes(n) + _varint_bytes(m))
        total += m * per_token + chunks * (per_chunk + _CHUNK_OVERHEAD) + _ALIGNED_OVERHEAD
    return total


def item_texts(items: Sequence[TraceItem]) -> builtins.list[str]:
    """The items' texts: `items.texts()` when the sequence has it (the servicer's items, which
    convert their arrays only when an item is read), else each item's."""
    texts = getattr(items, "texts", None)
    return list(texts()) if texts is not None else [it.text for it in items]


def source_counts(items: Sequence[TraceItem]) -> builtins.list[int]:
    """The items' source token counts (`items.source_counts()` when it has it, as `item_texts`)."""
    counts = getattr(items, "source_counts", None)
    return (list(counts()) if counts is not None
            else [int(np.asarray(it.source_token_ids).size) for it in items])


def item_lengths(items: Sequence[TraceItem]) -> builtins.list[tuple[int, int, int, int]]:
    """Each item's (source ids, values, offset starts, offset ends) counts
    (`items.lengths()` when it has it, as `item_texts`)."""
    lengths = getattr(items, "lengths", None)
    if lengths is not None:
        return list(lengths())
    out = []
    for it in items:
        n = int(np.asarray(it.source_token_ids).size)
        off = None if it.source_offsets is None else np.asarray(it.source_offsets)
        k = 0 if off is None or off.size == 0 else (off.shape[0] if off.ndim == 2 else off.size)
        out.append((n, int(np.asarray(it.values).size), k, k))
    return out


_EMPTY = (np.zeros(0, dtype=np.int64), np.zeros((0, 2), dtype=np.int64))


def _given(item: TraceItem) -> bool:
    """The item carries its source offsets (otherwise THL re-encodes its text)."""
    return item.source_offsets is not None and np.asarray(item.source_offsets).size > 0


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
        return list(self.iter_retokenize(tokenizer_id, texts, add_special_tokens,
                                         apply_chat_template))

    def iter_retokenize(self, tokenizer_id: str, texts: Sequence[str],
                        add_special_tokens: bool = False, apply_chat_template: bool = False
                        ) -> Iterator[TokenizedText]:
        """`retokenize`, one text at a time: every check runs before the first comes out, and
        a block's Encodings are gone before the next block is encoded."""
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
        return self._retokenized(tok, texts, add_special_tokens)

    def _retokenized(self, tok: LoadedTokenizer, texts: Sequence[str],
                     add_special_tokens: bool) -> Iterator[TokenizedText]:
        for lo, hi in encode_blocks(texts, max(1, self.limits.align_block_items)):
            part = list(texts[lo:hi])
            encs = encode_block(tok.backend, part, add_special_tokens)
            for i, text in enumerate(part):
                ids, offsets, special = token_arrays(encs[i])
                encs[i] = None  # its memory goes before the next text's arrays are made
                yield TokenizedText(ids, offsets, text,
                                    self._residual(tok, text, ids, offsets, special))
                del ids, offsets, special  # gone before the next text is encoded
            del encs

    # -- align ----------------------------------------------------------------------------
    def align_trace(self, source_tokenizer_id: str, target_tokenizer_id: str,
                    items: Sequence[TraceItem], mode: Mode = "chunk",
                    placement: Placement = "last") -> AlignTraceResult:
        """Move source token traces onto the target tokenizer's tokens (see `align`)."""
        results = list(self.iter_align(source_tokenizer_id, target_tokenizer_id, items, mode,
                                       placement))
        agg = aggregate_residual([r.residual for r in results],
                                 [len(r.target_token_ids) for r in results])
        return AlignTraceResult(results, agg)

    def iter_align(self, source_tokenizer_id: str, target_tokenizer_id: str,
                   items: Sequence[TraceItem], mode: Mode = "chunk",
                   placement: Placement = "last", *, answer_checked: bool = False
                   ) -> Iterator[AlignedTrace]:
        """`align_trace`, one item at a time (the batch residual is the caller's:
        `aggregate_residual`): every check runs before the first comes out, and a block's
        Encodings are gone before the next block is encoded. `answer_checked`: the caller ran
        `check_align_answer` on these items already."""
        if mode not in MODES:
            raise InvalidArgument("mode", f"{quote(mode)} is not one of {MODES}")
        if placement not in PLACEMENTS:
            raise InvalidArgument("placement", f"{quote(placement)} is not one of {PLACEMENTS}")
        src = self.registry.get(source_tokenizer_id, "source_tokenizer_id")
        tgt = self.registry.get(target_tokenizer_id, "target_tokenizer_id")
        texts, counts = item_texts(items), source_counts(items)
        self.check_texts(texts, "items")
        self.check_item_sizes(items)
        self._check_items(src, items)
        if not answer_checked:
            self.check_align_answer(tgt, texts, counts)
        memory.trim_after(sum(counts))
        blocks = encode_blocks(texts, max(1, self.limits.align_block_items))
        return self._aligned(src, tgt, items, blocks, mode, placement)

    def check_item_sizes(self, items: Sequence[TraceItem]) -> None:
        """The rules of the items that their lengths alone decide (how many source tokens a
        text can have, one value and none or one offset pair per token), read without
        converting any array: a request refused for them costs nothing more."""
        texts = item_texts(items)
        for i, (n, values, starts, ends) in enumerate(item_lengths(items)):
            most = (MAX_SOURCE_TOKENS_PER_BYTE * len(texts[i].encode("utf-8"))
                    + _SPECIAL_TOKENS_SLACK)
            if n > most:
                raise InvalidArgument(f"items[{i}].source_token_ids",
                                      f"{n} tokens for a text of {len(texts[i])} characters; "
                                      f"at most {most} can be its tokens")
            if values != n:
                raise InvalidArgument(f"items[{i}].values", f"{values} values for {n} source "
                                      "tokens (need one per token)")
            if starts != ends:
                raise InvalidArgument(f"items[{i}].source_offset_ends",
                                      f"{ends} ends for {starts} starts")
            if starts and starts != n:
                raise InvalidArgument(f"items[{i}].source_offsets", "need one (start, end) per "
                                      f"source token ({n}), got shape ({starts}, 2)")

    def check_align_answer(self, tgt: LoadedTokenizer, texts: Sequence[str],
                           source_tokens: Sequence[int]) -> None:
        """RESOURCE_EXHAUSTED for items of `texts` with `source_tokens` tokens each whose
        answer could pass the message limit: bounded from the texts' sizes (one target token a
        byte at most) and, only when that bound is too loose, from the target's token counts
        (counted without offsets, the fast way, before anything else is done), largest text
        first, until what is counted decides: the bound with the rest at one token a byte fits
        (answered), or the counted items alone pass the limit (refused)."""
        limit = self.limits.max_response_bytes
        if limit is None:
            return
        vocab = tgt.info.vocab_size
        counts = [len(t.encode("utf-8")) + _SPECIAL_TOKENS_SLACK for t in texts]
        if align_response_bound(texts, source_tokens, counts, vocab) <= limit:
            return
        count = getattr(tgt.backend, "encode_batch_fast", tgt.backend.encode_batch)
        order = sorted(range(len(texts)), key=lambda i: -counts[i])
        done: builtins.list[int] = []
        for lo, hi in encode_blocks([texts[i] for i in order],
                                    max(1, self.limits.align_block_items)):
            block = order[lo:hi]
            for i, enc in zip(block, count([texts[i] for i in block], add_special_tokens=False),
                              strict=True):
                counts[i] = len(enc)
            done += block
            if align_response_bound(texts, source_tokens, counts, vocab) <= limit:
                return
            counted = align_response_bound([texts[i] for i in done],
                                           [source_tokens[i] for i in done],
                                           [counts[i] for i in done], vocab)
            if counted > limit:
                break
        self._check_response("items", align_response_bound(texts, source_tokens, counts, vocab),
                             texts)

    def _aligned(self, src: LoadedTokenizer, tgt: LoadedTokenizer, items: Sequence[TraceItem],
                 blocks: builtins.list[tuple[int, int]], mode: Mode, placement: Placement
                 ) -> Iterator[AlignedTrace]:
        """The items' alignments, block by block; a block's items are read from `items` only
        now (the servicer's items convert from the request as they are read)."""
        texts = item_texts(items)
        for lo, hi in blocks:
            encs = encode_block(tgt.backend, texts[lo:hi])
            target = []
            for j in range(hi - lo):
                ids, offsets, _ = token_arrays(encs[j])
                encs[j] = None
                target.append((ids, offsets))
            del encs, ids, offsets
            memory.trim_after(sum(len(ids) for ids, _ in target))
            # The block's items are converted only now, after the Encodings are gone.
            block = [items[i] for i in range(lo, hi)]
            src_offsets = self._source_offsets(src, block, lo)
            s_st, s_en, s_b = core.concat_offsets(src_offsets)
            del src_offsets
            t_st, t_en, t_b = core.concat_offsets([o for _, o in target])
            vals = (np.concatenate([np.asarray(it.values, dtype=np.float64).reshape(-1)
                                    for it in block]) if block else np.zeros(0))
            del block
            lengths = np.array([len(t) for t in texts[lo:hi]], dtype=np.int64)
            batch = core.align_batch(lengths, s_st, s_en, s_b, t_st, t_en, t_b, vals,
                                     mode=mode, placement=placement)
            del s_st, s_en, s_b, t_st, t_en, t_b, vals
            for j in range(hi - lo):
                item = batch.item(j)
                ids, offsets = target[j]
                target[j] = _EMPTY
                residual = self._residual(tgt, texts[lo + j], ids, offsets,
                                          np.zeros(len(ids), dtype=bool),
                                          item.multi_token_chunk_share)
                yield AlignedTrace(ids, offsets, item.target_values, item.chunks,
                                   item.sequence_value, item.mass_error, residual)
                # Nothing of this item (its chunks are views of the block's) stays alive
                # while the next block is encoded.
                del item, ids, offsets, residual
            del batch, target

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

    def _check_items(self, src: LoadedTokenizer, items: Sequence[TraceItem]) -> None:
        """Every rule of the items that depends on the request alone: token counts, values,
        ids, offsets (one item's arrays at a time)."""
        vocab = src.info.vocab_size
        for i, it in enumerate(items):
            ids = np.asarray(it.source_token_ids, dtype=np.int64).reshape(-1)
            most = MAX_SOURCE_TOKENS_PER_BYTE * len(it.text.encode("utf-8")) + _SPECIAL_TOKENS_SLACK
            if ids.shape[0] > most:
                raise InvalidArgument(f"items[{i}].source_token_ids",
                                      f"{ids.shape[0]} tokens for a text of {len(it.text)} "
                                      f"characters; at most {most} can be its tokens")
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
            if _given(it):
                off = np.asarray(it.source_offsets, dtype=np.int64)
                if off.ndim != 2 or off.shape[1] != 2 or off.shape[0] != ids.shape[0]:
                    raise InvalidArgument(f"items[{i}].source_offsets", "need one (start, end) "
                                          f"per source token ({ids.shape[0]}), got shape "
                                          f"{tuple(off.shape)}")
                problem = core.validate_offsets(off[:, 0], off[:, 1], len(it.text))
                if problem:
                    raise InvalidArgument(f"items[{i}].source_offsets", problem)

    @staticmethod
    def _source_offsets(src: LoadedTokenizer, block: Sequence[TraceItem], first: int
                        ) -> builtins.list[np.ndarray]:
        """Source offsets of a block's items (items[first:]): as sent, or from re-encoding the
        text, whose ids must then be the item's (with or without special tokens)."""
        out: list[np.ndarray] = []
        for j, it in enumerate(block):
            ids = np.asarray(it.source_token_ids, dtype=np.int64).reshape(-1)
            if _given(it):
                out.append(np.asarray(it.source_offsets, dtype=np.int64))
                continue
            if ids.shape[0] == 0 and it.text == "":
                out.append(np.zeros((0, 2), dtype=np.int64))
                continue
            for special in (False, True):
                got, offsets, _ = token_arrays(src.backend.encode(
                    it.text, add_special_tokens=special))
                if np.array_equal(ids, got):
                    out.append(offsets)
                    break
            else:
                raise InvalidArgument(
                    f"items[{first + j}].source_token_ids", "without source offsets the ids must "
                    "equal the source tokenizer's encoding of text (they do not); send "
                    "source_offset_starts/ends")
        return out

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

