"""Prometheus metrics of THL: residual histograms and token/chunk counters."""

from __future__ import annotations

import contextlib

from prometheus_client import Counter, Gauge, Histogram

from mutualrl.common.alignment_types import Residual

ITEMS = Counter("mutualrl_thl_items", "Texts retokenized / traces aligned.", ["rpc", "target"])
SOURCE_TOKENS = Counter("mutualrl_thl_source_tokens", "Source tokens aligned.", ["target"])
TARGET_TOKENS = Counter("mutualrl_thl_target_tokens", "Target tokens produced.", ["rpc", "target"])
CHUNKS = Counter("mutualrl_thl_chunks", "Alignment chunks produced.", ["target"])
MULTI_TOKEN_TARGET_TOKENS = Counter(
    "mutualrl_thl_multi_token_chunk_target_tokens",
    "Target tokens inside chunks that do not pair one-to-one (numerator of the share).",
    ["target"])
ROUNDTRIP = Histogram(
    "mutualrl_thl_roundtrip_mismatch_chars", "Per text: edit distance text vs decode(encode).",
    ["rpc", "target"], buckets=(0, 1, 2, 5, 10, 20, 50, 100, 500, 1000, 10000))
UNCOVERED = Histogram(
    "mutualrl_thl_uncovered_bytes", "Per text: UTF-8 bytes covered by no target token.",
    ["rpc", "target"], buckets=(0, 1, 2, 5, 10, 20, 50, 100, 500, 1000, 10000))
NORMALIZED = Histogram(
    "mutualrl_thl_normalized_changed_chars", "Per text: characters the normalizer changed.",
    ["rpc", "target"], buckets=(0, 1, 2, 5, 10, 20, 50, 100, 500, 1000, 10000))
SHARE = Histogram(
    "mutualrl_thl_multi_token_chunk_share", "Per trace: share of target tokens in multi-token "
    "chunks.", ["target"], buckets=(0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1))
CACHE_ENTRIES = Gauge("mutualrl_thl_tokenizer_cache_entries",
                      "Loaded tokenizers kept in memory (at most thl.cache_size).")
CACHE_BYTES = Gauge("mutualrl_thl_tokenizer_cache_bytes", "Serialized bytes of the loaded "
                    "tokenizers kept in memory (at most thl.cache_max_bytes).")
WORKING_BYTES = Gauge("mutualrl_thl_working_bytes", "Working memory the running Retokenize / "
                      "AlignTrace calls hold, as admitted (thl.max_working_bytes).")
MASS_ERROR = Counter("mutualrl_thl_inexact_mass_traces",
                     "Traces whose chunk sums could not all be represented exactly.", ["target"])


def observe_text(rpc: str, target: str, residual: Residual) -> None:
    ROUNDTRIP.labels(rpc, target).observe(residual.roundtrip_mismatch_chars)
    UNCOVERED.labels(rpc, target).observe(residual.uncovered_bytes)
    NORMALIZED.labels(rpc, target).observe(residual.normalized_changed_chars)


_BY_RPC_AND_TARGET = (ITEMS, TARGET_TOKENS, ROUNDTRIP, UNCOVERED, NORMALIZED)
_BY_TARGET = (SOURCE_TOKENS, CHUNKS, MULTI_TOKEN_TARGET_TOKENS, SHARE, MASS_ERROR)


def forget_target(tokenizer_id: str) -> None:
    """Drop the series of a tokenizer no longer registered: ids come and go with runs, and
    their series would otherwise accumulate for the life of the process."""
    for metric in _BY_RPC_AND_TARGET:
        for rpc in ("Retokenize", "AlignTrace"):
            with contextlib.suppress(KeyError):  # never observed
                metric.remove(rpc, tokenizer_id)
    for metric in _BY_TARGET:
        with contextlib.suppress(KeyError):
            metric.remove(tokenizer_id)
