"""`mutualrl bench thl`: our alignment core against `spacy_alignments.get_alignments`.

Both sides get the same pre-computed tokenizations of the same corpus (tokenization is not
timed): ours gets the offset arrays, spacy-alignments the token strings it needs (the text
slices the offsets point at). Timed: for ours, concatenating a batch's offsets and running
`align_batch` (chunks, exact chunk sums of per-token values, placement on target tokens, the
multi-token residual) — more work than spacy-alignments' token-to-token mapping; for spacy,
`get_alignments` per text. Each side's best of `repeats` passes is reported, interleaved so
load from other processes hits both alike.
"""

from __future__ import annotations

import platform
import time
from typing import Any

import numpy as np

from mutualrl.thl.align import align_batch, concat_offsets
from mutualrl.thl.corpus import TextGenerator


def build_corpus(n_texts: int, seed: int, source: Any, min_tokens: int, max_tokens: int
                 ) -> list[str]:
    """`n_texts` texts whose source token counts lie in [min_tokens, max_tokens]."""
    gen = TextGenerator(seed)
    texts: list[str] = []
    while len(texts) < n_texts:
        # About 1.3-1.6 byte-level BPE tokens per word: aim the word counts at the token range.
        cand = gen.texts(256, min_tokens * 2 // 3, max_tokens * 2 // 3)
        encs = source.backend_tokenizer.encode_batch(cand, add_special_tokens=False)
        texts.extend(t for t, e in zip(cand, encs, strict=True)
                     if min_tokens <= len(e.ids) <= max_tokens)
    return texts[:n_texts]


def run_bench(n_texts: int = 2000, seed: int = 0, batch: int = 64, repeats: int = 3,
              source_kind: str = "byte_bpe", target_kind: str = "wordpiece",
              vocab_size: int = 4000, min_tokens: int = 200, max_tokens: int = 800
              ) -> dict[str, Any]:
    import spacy_alignments

    from mutualrl.thl.tokenizers import train_tokenizer

    train = TextGenerator(seed + 1).texts(600, 40, 200)
    source = train_tokenizer(source_kind, train, vocab_size)
    target = train_tokenizer(target_kind, train, vocab_size)
    texts = build_corpus(n_texts, seed, source, min_tokens, max_tokens)
    s_enc = source.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    t_enc = target.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    s_off = [np.asarray(e.offsets, dtype=np.int64).reshape(-1, 2) for e in s_enc]
    t_off = [np.asarray(e.offsets, dtype=np.int64).reshape(-1, 2) for e in t_enc]
    s_str = [[t[a:b] for a, b in e.offsets] for t, e in zip(texts, s_enc, strict=True)]
    t_str = [[t[a:b] for a, b in e.offsets] for t, e in zip(texts, t_enc, strict=True)]
    rng = np.random.default_rng(seed)
    # Behaviour log-probs as a policy would send them: float32, <= 0.
    vals = [(-np.abs(rng.standard_normal(len(o)) * 2.0)).astype(np.float32).astype(np.float64)
            for o in s_off]
    lengths = np.array([len(t) for t in texts], dtype=np.int64)
    n_src = int(sum(len(o) for o in s_off))
    n_tgt = int(sum(len(o) for o in t_off))

    def ours(block: int) -> tuple[float, int]:
        start = time.perf_counter()
        inexact = 0
        for lo in range(0, len(texts), block):
            hi = lo + block
            s0, s1, sb = concat_offsets(s_off[lo:hi])
            t0, t1, tb = concat_offsets(t_off[lo:hi])
            out = align_batch(lengths[lo:hi], s0, s1, sb, t0, t1, tb,
                              np.concatenate(vals[lo:hi]))
            inexact += int(np.count_nonzero(out.mass_errors))
        return time.perf_counter() - start, inexact

    def spacy() -> float:
        start = time.perf_counter()
        for a, b in zip(s_str, t_str, strict=True):
            spacy_alignments.get_alignments(a, b)
        return time.perf_counter() - start

    t_ours, t_item, t_spacy = [], [], []
    inexact = 0
    for _ in range(max(1, repeats)):
        secs, inexact = ours(batch)
        t_ours.append(secs)
        t_spacy.append(spacy())
        t_item.append(ours(1)[0])
    best_ours, best_item, best_spacy = min(t_ours), min(t_item), min(t_spacy)
    return {
        "bench": "thl",
        "texts": len(texts),
        "source_tokenizer": source_kind,
        "target_tokenizer": target_kind,
        "vocab_size": vocab_size,
        "source_tokens": n_src,
        "target_tokens": n_tgt,
        "source_tokens_per_text": {"min": int(min(len(o) for o in s_off)),
                                   "mean": n_src / len(texts),
                                   "max": int(max(len(o) for o in s_off))},
        "batch": batch,
        "repeats": repeats,
        "seed": seed,
        "ours_tokens_per_s": n_src / best_ours,
        "ours_per_item_tokens_per_s": n_src / best_item,
        "spacy_alignments_tokens_per_s": n_src / best_spacy,
        "ratio": best_spacy / best_ours,
        "ratio_per_item": best_spacy / best_item,
        "ours_seconds": best_ours,
        "ours_per_item_seconds": best_item,
        "spacy_alignments_seconds": best_spacy,
        "items_with_inexact_mass": inexact,
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
