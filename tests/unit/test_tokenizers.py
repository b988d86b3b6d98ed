"""Offline tokenizer training: round trips, offsets and save/load for every kind."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from mutualrl.thl.tokenizers import KINDS, SPECIALS, train_tokenizer

CORPUS = [
    "add:37+58=95;",
    "sub:91-46=45;",
    "rev:3871=1783;",
    "sort:5193=1359;",
    "7+8=15c1,3+5+1=9>95;",
    "the quick brown fox jumps over the lazy dog. Pack my box with five dozen jugs! (twice)",
] * 40

ASCII_SAMPLES = [
    "add:37+58=95;",
    "rev:1,7,8,3>1783;",
    "the lazy  dog jumps, (twice)!",
    "x",
]


@pytest.fixture(scope="module", params=KINDS)
def tok(request: pytest.FixtureRequest) -> tuple[str, PreTrainedTokenizerFast]:
    return request.param, train_tokenizer(request.param, CORPUS, 200)


def _expected(kind: str, text: str) -> str:
    # WordPiece normalises with a lower-casing BertNormalizer; the rest round-trip exactly.
    return text.lower() if kind == "wordpiece" else text


def test_round_trip_ascii(tok: tuple[str, PreTrainedTokenizerFast]) -> None:
    kind, t = tok
    assert t.is_fast
    for text in ASCII_SAMPLES:
        ids = t(text, add_special_tokens=False)["input_ids"]
        assert t.unk_token_id not in ids, (kind, text)
        assert t.decode(ids) == _expected(kind, text), (kind, text)


def test_specials_have_fixed_ids(tok: tuple[str, PreTrainedTokenizerFast]) -> None:
    _, t = tok
    assert [t.pad_token_id, t.bos_token_id, t.eos_token_id, t.unk_token_id] == [0, 1, 2, 3]
    assert t.convert_ids_to_tokens([0, 1, 2, 3]) == list(SPECIALS)
    assert t.padding_side == "left"


def test_offsets_monotone_and_cover_text(tok: tuple[str, PreTrainedTokenizerFast]) -> None:
    kind, t = tok
    for text in ASCII_SAMPLES:
        enc = t(text, add_special_tokens=False, return_offsets_mapping=True)
        offs = enc["offset_mapping"]
        assert len(offs) == len(enc["input_ids"])
        prev_end = 0
        for start, end in offs:
            assert 0 <= start <= end <= len(text)
            assert start >= prev_end, (kind, text, offs)
            prev_end = end
        # Tokens tile the text: no gaps, last token ends at the end (ASCII, nothing dropped).
        assert offs[0][0] == 0 and offs[-1][1] == len(text)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(offs)), (kind, offs)


def test_char_offsets_are_one_char_each() -> None:
    t = train_tokenizer("char", CORPUS, 100)
    text = "sort:5193="
    enc = t(text, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["offset_mapping"] == [(i, i + 1) for i in range(len(text))]
    assert len(t) < 60


def test_alphabet_option_covers_unseen_chars() -> None:
    for kind in ("wordpiece", "unigram", "char"):
        t = train_tokenizer(kind, ["add:37+58=95;"] * 20, 100, alphabet="@#")
        ids = t("@#", add_special_tokens=False)["input_ids"]
        assert t.unk_token_id not in ids and t.decode(ids) == "@#", kind


def test_byte_bpe_merges_cross_punctuation_without_regex() -> None:
    t = train_tokenizer("byte_bpe", CORPUS, 400, use_regex=False)
    toks = t.convert_ids_to_tokens(t("add:37+58=95;", add_special_tokens=False)["input_ids"])
    assert any(any(c.isdigit() for c in s) and any(not c.isalnum() for c in s) for s in toks)
    t_regex = train_tokenizer("byte_bpe", CORPUS, 400, use_regex=True)
    toks_r = t_regex.convert_ids_to_tokens(
        t_regex("add:37+58=95;", add_special_tokens=False)["input_ids"]
    )
    assert not any(any(c.isdigit() for c in s) and ":" in s for s in toks_r)


def test_save_load_same_ids(tok: tuple[str, PreTrainedTokenizerFast], tmp_path: Path) -> None:
    kind, t = tok
    t.save_pretrained(tmp_path)
    back = AutoTokenizer.from_pretrained(tmp_path)
    assert back.is_fast
    for text in ASCII_SAMPLES:
        a = t(text, add_special_tokens=False, return_offsets_mapping=True)
        b = back(text, add_special_tokens=False, return_offsets_mapping=True)
        assert a["input_ids"] == b["input_ids"], kind
        assert a["offset_mapping"] == b["offset_mapping"], kind
        assert back.decode(b["input_ids"]) == _expected(kind, text)
    assert back.pad_token_id == t.pad_token_id and back.eos_token_id == t.eos_token_id


def test_deterministic_training() -> None:
    # WordPiece is left out: its trainer breaks ties between equal-count merges in Rust hash-map
    # order, which varies between processes (ids are canonicalised, the tie winners are not).
    for kind in ("byte_bpe", "unigram", "char"):
        a = train_tokenizer(kind, CORPUS, 150)
        b = train_tokenizer(kind, CORPUS, 150)
        assert a.get_vocab() == b.get_vocab(), kind


def test_rejects_unknown_kind_and_bare_string() -> None:
    with pytest.raises(ValueError, match="unknown tokenizer kind"):
        train_tokenizer("sentencepiece", CORPUS, 100)
    with pytest.raises(TypeError):
        train_tokenizer("char", "abc", 100)


def test_byte_bpe_split_digits_keeps_one_token_per_digit() -> None:
    t = train_tokenizer("byte_bpe", CORPUS, 300, use_regex=True, split_digits=True)
    enc = t("add:37+58=95;", add_special_tokens=False, return_offsets_mapping=True)
    toks = t.convert_ids_to_tokens(enc["input_ids"])
    assert [x for x in toks if any(c.isdigit() for c in x)] == list("375895")
    assert t.decode(enc["input_ids"]) == "add:37+58=95;"
    assert enc["offset_mapping"][-1][1] == len("add:37+58=95;")
