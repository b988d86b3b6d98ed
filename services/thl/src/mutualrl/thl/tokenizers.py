"""Train small tokenizers offline and wrap them as `transformers` fast tokenizers.

Nothing here downloads anything: every tokenizer is learned from an iterable of texts with the
`tokenizers` library, then wrapped in a `PreTrainedTokenizerFast` so it saves with
`save_pretrained` and reloads with `AutoTokenizer.from_pretrained` exactly like a hub checkpoint.

Four kinds, chosen to give heterogeneous policies genuinely different segmentations:

- `byte_bpe`: GPT-2 style byte-level BPE (ByteLevel pre-tokenizer, GPT-2 regex optional).
- `wordpiece`: BERT-style WordPiece, lower-casing BertNormalizer, whitespace and punctuation
  isolated as their own pieces.
- `unigram`: SentencePiece-style Unigram over Metaspace (`▁`) pieces, NFKC normalisation.
- `char`: one token per character (WordLevel over single characters).

Every kind decodes back to its (normalised) input, so completions decoded from generated ids can
be verified as text; that is why the WordPiece decoder fuses pieces instead of joining words
with spaces as BERT's decoder does (BERT's would turn `95;` into `95 ;`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

KINDS: tuple[str, ...] = ("byte_bpe", "wordpiece", "unigram", "char")

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
# Order fixes the ids: pad=0, bos=1, eos=2, unk=3 for every kind, which keeps configs simple.
SPECIALS: tuple[str, ...] = (PAD, BOS, EOS, UNK)


def _byte_bpe(texts: Iterable[str], vocab_size: int, *, use_regex: bool = False,
              min_frequency: int = 2, split_digits: bool = False) -> Tokenizer:
    """GPT-2 style byte-level BPE.

    `use_regex=False` lets merges cross digits and punctuation; `split_digits=True` keeps every
    digit its own token (as Llama 3 / GPT-4 style tokenizers do), so numbers are never chunked
    differently from one operand to the next.
    """
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                  byte_level])
                         if split_digits else byte_level)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIALS),
        # All 256 bytes up front, so no input is ever out of vocabulary.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def _wordpiece(texts: Iterable[str], vocab_size: int, *, lowercase: bool = True,
               min_frequency: int = 1, alphabet: str = "") -> Tokenizer:
    """BERT-style WordPiece with a lower-casing BertNormalizer.

    Whitespace is kept as its own piece (BERT drops it) so that decoding is exact. Ids are
    canonical, but which of several equal-count merges wins at the vocabulary limit can differ
    between processes (the trainer's hash-map order): build once and share the saved files.
    """
    tok = Tokenizer(models.WordPiece(unk_token=UNK, continuing_subword_prefix="##"))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lowercase, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\s"), behavior="isolated"),
        pre_tokenizers.Punctuation(behavior="isolated"),
    ])
    tok.decoder = decoders.Sequence([decoders.Replace(Regex("^##"), ""), decoders.Fuse()])
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIALS),
        continuing_subword_prefix="##",
        initial_alphabet=sorted(set(alphabet.lower() if lowercase else alphabet)),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return _canonical_ids(tok)


def _unigram(texts: Iterable[str], vocab_size: int, *, prepend_scheme: str = "never",
             max_piece_length: int = 8, alphabet: str = "") -> Tokenizer:
    """SentencePiece-style Unigram over Metaspace pieces with NFKC normalisation.

    `prepend_scheme="never"` (not SentencePiece's "first") because a prepended `▁` has no
    character of its own: its offsets would overlap the first real token, and a completion
    tokenized on its own would start differently from the same text inside a sequence.
    """
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend_scheme)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=prepend_scheme)
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        unk_token=UNK,
        max_piece_length=max_piece_length,
        initial_alphabet=sorted(set(alphabet)),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return _canonical_ids(tok)


def _char(texts: Iterable[str], vocab_size: int, *, alphabet: str = "") -> Tokenizer:
    """One token per character: the vocabulary is the specials plus every character seen.

    `vocab_size` is an upper bound; the most frequent characters win when the corpus has more.
    """
    counts: dict[str, int] = {}
    for text in [*texts, alphabet]:
        for ch in text:
            counts[ch] = counts.get(ch, 0) + 1
    room = max(vocab_size - len(SPECIALS), 0)
    # Sorted by frequency then code point, so the same corpus always gives the same ids.
    chars = sorted(counts, key=lambda c: (-counts[c], c))[:room]
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for ch in sorted(chars):
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return tok


def _canonical_ids(tok: Tokenizer) -> Tokenizer:
    """Renumber a trained WordPiece/Unigram vocabulary in a fixed order.

    Their trainers return the same pieces (and near-equal scores) every run but assign ids in
    hash-map order; segmentation does not depend on ids, so sorting makes training reproducible.
    """
    spec = json.loads(tok.to_str())
    model = spec["model"]
    if model["type"] == "WordPiece":
        rest = sorted((p for p in model["vocab"] if p not in SPECIALS),
                      key=lambda p: (p.startswith("##"), len(p), p))
        model["vocab"] = {p: i for i, p in enumerate([*SPECIALS, *rest])}
    elif model["type"] == "Unigram":
        # Scores come from parallel float sums that differ in the last bits between runs.
        pieces = {p: round(s, 4) for p, s in model["vocab"]}
        rest = sorted((p for p in pieces if p not in SPECIALS), key=lambda p: (-pieces[p], p))
        model["vocab"] = [[p, pieces[p]] for p in [*SPECIALS, *rest]]
        model["unk_id"] = SPECIALS.index(UNK)
    else:
        return tok
    # Added (special) tokens must keep pointing at the renumbered ids.
    for added in spec.get("added_tokens", []):
        added["id"] = SPECIALS.index(added["content"])
    return Tokenizer.from_str(json.dumps(spec))


_BUILDERS: dict[str, Callable[..., Tokenizer]] = {
    "byte_bpe": _byte_bpe, "wordpiece": _wordpiece, "unigram": _unigram, "char": _char}


def wrap(tok: Tokenizer, *, model_max_length: int = 2048) -> PreTrainedTokenizerFast:
    """Wrap a raw `tokenizers.Tokenizer` with the shared special tokens set."""
    for s in SPECIALS:
        if tok.token_to_id(s) is None:
            raise ValueError(f"tokenizer lacks special token {s!r}")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        model_max_length=model_max_length,
        # Left padding is what batched generation needs; training code pads explicitly.
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    return fast


def train_tokenizer(kind: str, texts: Iterable[str], vocab_size: int,
                    **opts: Any) -> PreTrainedTokenizerFast:
    """Train a tokenizer of `kind` (one of `KINDS`) on `texts` and return it as a fast tokenizer.

    Options per kind: byte_bpe `use_regex` (False: merges cross digits/punctuation),
    `split_digits` (one token per digit), `min_frequency`; wordpiece `lowercase`,
    `min_frequency`, `alphabet`; unigram `prepend_scheme`, `max_piece_length`, `alphabet`;
    char `alphabet` (characters to include even if unseen).
    Common: `model_max_length`.
    """
    if kind not in _BUILDERS:
        raise ValueError(f"unknown tokenizer kind {kind!r}; expected one of {KINDS}")
    model_max_length = int(opts.pop("model_max_length", 2048))
    # Materialise once: several trainers iterate more than once and generators would run dry.
    corpus = list(_as_iter(texts))
    if not corpus:
        raise ValueError("cannot train a tokenizer on an empty corpus")
    tok = _BUILDERS[kind](corpus, vocab_size, **opts)
    return wrap(tok, model_max_length=model_max_length)


def _as_iter(texts: Iterable[str]) -> Iterator[str]:
    if isinstance(texts, str):
        raise TypeError("texts must be an iterable of strings, not a single string")
    yield from texts


# Classes under which `wrap` saves; a directory declaring one of them holds a plain tokenizer.json.
_GENERIC_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """Load a saved tokenizer directory as a fast tokenizer, exactly as it was saved.

    `AutoTokenizer.from_pretrained` is used for real checkpoints. A directory saved from `wrap`
    declares the generic class and is loaded with that class directly: transformers 5 otherwise
    lets the model type in a neighbouring config.json pick a model-specific class (Qwen2 ->
    Qwen2Tokenizer), which rebuilds its own pipeline and ignores the trained tokenizer.json.
    """
    from transformers import AutoTokenizer

    path = Path(path)
    cfg_file = path / "tokenizer_config.json"
    declared = None
    if cfg_file.exists():
        declared = json.loads(cfg_file.read_text(encoding="utf-8")).get("tokenizer_class")
    if declared in _GENERIC_CLASSES and (path / "tokenizer.json").exists():
        tok = PreTrainedTokenizerFast.from_pretrained(path)
    else:
        tok = AutoTokenizer.from_pretrained(path)
    if not getattr(tok, "is_fast", False):
        raise TypeError(
            f"{path}: tokenizer {type(tok).__name__} is not a fast tokenizer; MutualRL needs "
            "character offsets from a `tokenizers` backend (save a tokenizer.json)"
        )
    return tok
