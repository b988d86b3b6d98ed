"""Tokenizers for THL tests, trained offline once per process and saved with save_pretrained.

`trained_tokenizers()` returns {name: directory} for every family THL must handle:
byte-level BPE, lower-casing WordPiece, Unigram/Metaspace with NFKC (prepend "never" and
"first"), character level, and a byte-level BPE whose post-processor adds BOS/EOS (special
tokens at offsets (0, 0)). Cached per process so a test process trains them once.
"""

from __future__ import annotations

import functools
import string
import tempfile
from pathlib import Path

from mutualrl.thl.corpus import TextGenerator

# Characters every tokenizer should know, so that unknown-token behaviour is the exception.
ALPHABET = (string.ascii_letters + string.digits + string.punctuation + " "
            + "éèüöäçñßøåæœ日本語中文字テストス한국어🎉🚀👍🏽\u0301\u0308Ωπ∑–…")

TEST_CORPUS_SEED = 7
FAMILIES = ("byte_bpe", "wordpiece", "unigram", "unigram_first", "char", "byte_bpe_special")


@functools.lru_cache(maxsize=1)
def trained_tokenizers() -> dict[str, str]:
    from tokenizers import processors

    from mutualrl.thl.tokenizers import train_tokenizer

    corpus = [*TextGenerator(TEST_CORPUS_SEED).texts(150, 10, 60), ALPHABET, ALPHABET.lower()]
    root = Path(tempfile.mkdtemp(prefix="thl-tokenizers-"))
    built = {
        "byte_bpe": train_tokenizer("byte_bpe", corpus, 400),
        "wordpiece": train_tokenizer("wordpiece", corpus, 400, alphabet=ALPHABET),
        "unigram": train_tokenizer("unigram", corpus, 400, alphabet=ALPHABET),
        "unigram_first": train_tokenizer("unigram", corpus, 400, alphabet=ALPHABET,
                                         prepend_scheme="first"),
        "char": train_tokenizer("char", corpus, 400, alphabet=ALPHABET),
        "byte_bpe_special": train_tokenizer("byte_bpe", corpus, 400),
    }
    special = built["byte_bpe_special"]
    bos, eos = special.bos_token, special.eos_token
    special.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", pair=f"{bos} $A {eos} $B {eos}",
        special_tokens=[(bos, special.bos_token_id), (eos, special.eos_token_id)])
    paths = {}
    for name, tok in built.items():
        path = root / name
        tok.save_pretrained(str(path))
        paths[name] = str(path)
    return paths
