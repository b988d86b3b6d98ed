"""Presets build offline, load through from_pretrained and have the stated sizes."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch

from mutualrl.trainer.runtime.presets import (
    MARKER,
    PRESETS,
    ensure_preset,
    fingerprint,
    load_policy,
    n_params,
)

torch.set_num_threads(1)

# name -> (model class, tokenizer kind, params within 2%)
EXPECTED = {
    "gpt2-bpe": ("GPT2LMHeadModel", "byte_bpe", 646_400),
    "gpt2-bpe-nosplit": ("GPT2LMHeadModel", "byte_bpe", 675_456),
    "llama-char": ("LlamaForCausalLM", "char", 595_328),
    "qwen2-wordpiece": ("Qwen2ForCausalLM", "wordpiece", 629_888),
    "qwen2-unigram": ("Qwen2ForCausalLM", "unigram", 617_088),
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("presets")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_loads_with_stated_size(name: str, cache: Path) -> None:
    path = ensure_preset(name, cache)
    assert (path / MARKER).exists() and (path / "tokenizer.json").exists()
    model, tok = load_policy(path)
    cls, kind, params = EXPECTED[name]
    assert type(model).__name__ == cls
    assert tok.is_fast and tok.padding_side == "left" and tok.pad_token_id == 0
    assert abs(n_params(model) - params) / params < 0.02
    meta = json.loads((path / "preset.json").read_text())
    assert meta["tokenizer"] == kind == PRESETS[name].tokenizer
    assert model.config.vocab_size == len(tok)
    # The trained tokenizer.json is what was loaded (not a model-specific rebuild).
    text = "sort:5193=1,3,5,9>1359;"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids and tok.decode(ids) == text
    with torch.no_grad():
        out = model(torch.tensor([ids]))
    assert out.logits.shape == (1, len(ids), len(tok))


def test_llama_char_matches_notes(cache: Path) -> None:
    model, tok = load_policy(ensure_preset("llama-char", cache))
    c = model.config
    assert (c.num_hidden_layers, c.hidden_size, c.intermediate_size) == (3, 128, 384)
    assert (c.num_attention_heads, c.num_key_value_heads, c.tie_word_embeddings) == (4, 2, True)
    assert len(tok) < 40
    assert tok.convert_ids_to_tokens(tok("add:37+58=", add_special_tokens=False)["input_ids"]) \
        == list("add:37+58=")


def test_gpt2_bpe_variants_split_differently(cache: Path) -> None:
    _, split = load_policy(ensure_preset("gpt2-bpe", cache))
    _, nosplit = load_policy(ensure_preset("gpt2-bpe-nosplit", cache))
    assert len(split) <= 400 and len(nosplit) == 500

    def pieces(tok: object, text: str) -> list[str]:
        return tok.convert_ids_to_tokens(tok(text)["input_ids"])  # type: ignore[attr-defined]

    # gpt2-bpe: GPT-2 pre-split and one token per digit (`add`, `:`, `3`, `7`, ...) ...
    assert pieces(split, "add:37+58=") == ["add", ":", "3", "7", "+", "5", "8", "="]
    # ... gpt2-bpe-nosplit: merges cross digits and punctuation (`,7`, `>1`, `3;`).
    mixed = pieces(nosplit, "1,7,8,3>1783;")
    assert any(any(c.isdigit() for c in p) and not p.isdigit() for p in mixed)
    assert len(mixed) < len("1,7,8,3>1783;")


def test_cache_name_carries_spec_fingerprint(cache: Path) -> None:
    path = ensure_preset("llama-char", cache)
    assert path.name == f"llama-char-s0-{fingerprint('llama-char')}"
    assert fingerprint("gpt2-bpe") != fingerprint("gpt2-bpe-nosplit")


def test_seed_changes_weights_not_tokenizer(cache: Path) -> None:
    m0, t0 = load_policy(ensure_preset("llama-char", cache, seed=0))
    m1, t1 = load_policy(ensure_preset("llama-char", cache, seed=1))
    assert t0.get_vocab() == t1.get_vocab()
    w0, w1 = m0.model.embed_tokens.weight, m1.model.embed_tokens.weight
    assert not torch.equal(w0, w1)


def test_ensure_preset_idempotent_and_concurrent(tmp_path: Path) -> None:
    paths: list[Path] = []
    threads = [threading.Thread(target=lambda: paths.append(ensure_preset("llama-char", tmp_path)))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(paths)) == 1
    stamp = (paths[0] / MARKER).read_text()
    assert ensure_preset("llama-char", tmp_path) == paths[0]
    assert (paths[0] / MARKER).read_text() == stamp  # not rebuilt
    assert [p.name for p in tmp_path.iterdir()] == [paths[0].name]  # no temp dirs left


def test_load_policy_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_policy(tmp_path)
    with pytest.raises(ValueError, match="dtype"):
        load_policy(tmp_path, dtype="int8")
    with pytest.raises(ValueError, match="unknown preset"):
        ensure_preset("gpt5", tmp_path)


def test_load_policy_refuses_slow_tokenizer(tmp_path: Path, cache: Path) -> None:
    import shutil

    from transformers import CanineTokenizer  # a pure-Python tokenizer that needs no files

    dst = tmp_path / "slow"
    shutil.copytree(ensure_preset("llama-char", cache), dst)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (dst / f).unlink()
    CanineTokenizer().save_pretrained(dst)
    with pytest.raises(TypeError, match="not a fast tokenizer"):
        load_policy(dst)


@pytest.mark.slow
def test_llama_10m_for_the_benchmark(cache: Path) -> None:
    model, tok = load_policy(ensure_preset("llama-10m", cache))
    assert 9.5e6 < n_params(model) < 11e6
    assert type(model).__name__ == "LlamaForCausalLM" and len(tok) == 500
