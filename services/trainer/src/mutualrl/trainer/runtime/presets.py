"""Tiny policy presets built offline, and the one loader every policy goes through.

A preset is a model config of some family (GPT-2, Llama, Qwen2) plus a tokenizer of some kind
trained on the synthetic task corpus (both regimes, all skills). `ensure_preset` builds it once
with random weights and `save_pretrained`s it; `load_policy` then loads it with
`AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained` — the same code path a
real local checkpoint takes, so nothing downstream knows whether a policy is a preset.

| preset            | family | tokenizer  | vocab | layers x width       | params   |
|-------------------|--------|------------|-------|----------------------|----------|
| `gpt2-bpe`        | GPT-2  | byte BPE^  | <=400 | 3 x 128, 4 heads     | ~0.65 M  |
| `gpt2-bpe-nosplit`| GPT-2  | byte BPE*  | 500   | 3 x 128, 4 heads     | ~0.68 M  |
| `llama-char`      | Llama  | char       | ~36   | 3 x 128/384, 4/2 kv  | ~0.60 M  |
| `qwen2-wordpiece` | Qwen2  | WordPiece  | ~300  | 3 x 128/384, 4/2 kv  | ~0.63 M  |
| `qwen2-unigram`   | Qwen2  | Unigram    | ~200  | 3 x 128/384, 4/2 kv  | ~0.62 M  |
| `llama-10m`       | Llama  | byte BPE*  | 500   | 12 x 256/768, 8 heads| ~10.3 M  |

(^) GPT-2 regex pre-split and one token per digit. (*) without any pre-split: merges cross
digits and punctuation. docs/science-notes.md pairs
`gpt2-bpe` with `llama-char` in the short regime and `gpt2-bpe-nosplit` with it in the worked
regime.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from mutualrl.thl.tokenizers import load_tokenizer, train_tokenizer
from mutualrl.trainer.config.task import SKILLS
from mutualrl.trainer.data.tasks import SyntheticTask, corpus

MARKER = "PRESET_READY"
CORPUS_PER_SKILL = 150


@dataclass(frozen=True)
class PresetSpec:
    """What a preset is made of."""

    family: str  # "gpt2" | "llama" | "qwen2"
    tokenizer: str  # a kind of mutualrl.thl.tokenizers.KINDS
    vocab_size: int  # target (an upper bound for char/unigram on a small corpus)
    config: dict[str, Any] = field(default_factory=dict)
    tokenizer_opts: dict[str, Any] = field(default_factory=dict)


# GPT-2's default dropout (0.1) is for large models; on a 0.65 M model learning arithmetic it
# cost most of the `add` accuracy in warm start, and Llama/Qwen2 configs default to none.
_SMALL_GPT2 = dict(n_layer=3, n_embd=128, n_head=4, n_positions=128, resid_pdrop=0.0,
                   embd_pdrop=0.0, attn_pdrop=0.0)
_SMALL_LLAMA = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                    max_position_embeddings=256)

PRESETS: dict[str, PresetSpec] = {
    # docs/science-notes.md policy A: GPT-2, 3 layers, d=128, 4 heads, byte-level BPE. Short regime:
    # vocab 400 with the GPT-2 pre-split and one token per digit. Measured (2000 SFT steps):
    # with BPE digit chunks (`37`, `+5`) `add` stalled at 0.19 held-out; per-digit tokens
    # reach 0.98 in 1200 steps, as the character-level policy does on `sub`.
    "gpt2-bpe": PresetSpec("gpt2", "byte_bpe", 400, dict(_SMALL_GPT2),
                           dict(use_regex=True, split_digits=True)),
    # Worked regime: vocab 500 without pre-split, so merges cross digits and punctuation
    # (`,7`, `>1`, `3;`) — the coarse, mismatched segmentation that exercises THL.
    "gpt2-bpe-nosplit": PresetSpec("gpt2", "byte_bpe", 500, dict(_SMALL_GPT2),
                                   dict(use_regex=False)),
    # docs/science-notes.md policy B: Llama, 3 layers, hidden 128, ffn 384, 4 heads / 2 KV, tied.
    "llama-char": PresetSpec("llama", "char", 64, dict(_SMALL_LLAMA)),
    "qwen2-wordpiece": PresetSpec("qwen2", "wordpiece", 300, dict(_SMALL_LLAMA)),
    "qwen2-unigram": PresetSpec("qwen2", "unigram", 200, dict(_SMALL_LLAMA)),
    # The trainer benchmark's ~10 M model.
    "llama-10m": PresetSpec("llama", "byte_bpe", 500,
                            dict(hidden_size=256, intermediate_size=768, num_hidden_layers=12,
                                 num_attention_heads=8, num_key_value_heads=8,
                                 tie_word_embeddings=True, max_position_embeddings=512),
                            dict(use_regex=False)),
}


# Bump when the corpus or the build procedure changes (the spec alone is fingerprinted).
BUILD_VERSION = 1


def fingerprint(name: str) -> str:
    """Short hash of a preset's spec and build version (part of its cache directory name)."""
    spec = PRESETS[name]
    text = json.dumps([BUILD_VERSION, CORPUS_PER_SKILL, spec.family, spec.tokenizer,
                       spec.vocab_size, spec.config, spec.tokenizer_opts], sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def preset_corpus(seed: int = 0) -> list[str]:
    """Texts the preset tokenizers learn from: every skill, short and worked completions."""
    texts: list[str] = []
    for regime in ("short", "worked"):
        task = SyntheticTask(regime=regime, skills=list(SKILLS))
        texts += corpus(task, CORPUS_PER_SKILL, seed=seed)
    return texts


def _model_config(spec: PresetSpec, tok: PreTrainedTokenizerFast) -> PretrainedConfig:
    ids = dict(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id)
    if spec.family == "gpt2":
        return GPT2Config(**spec.config, **ids)
    if spec.family == "llama":
        return LlamaConfig(**spec.config, **ids)
    if spec.family == "qwen2":
        return Qwen2Config(**spec.config, **ids)
    raise ValueError(f"unknown family {spec.family!r}")


def build_preset(name: str, out_dir: Path, seed: int = 0) -> None:
    """Train the tokenizer, initialise the model from `seed` and save both into `out_dir`."""
    spec = PRESETS[name]
    # The tokenizer depends only on the preset (fixed corpus seed), not on the init seed, so
    # every seed of a preset shares one vocabulary.
    tok = train_tokenizer(spec.tokenizer, preset_corpus(0), spec.vocab_size,
                          **spec.tokenizer_opts)
    cfg = _model_config(spec, tok)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    n_params = sum(p.numel() for p in model.parameters())
    meta = dict(name=name, family=spec.family, tokenizer=spec.tokenizer, vocab=len(tok),
                params=n_params, seed=seed)
    (out_dir / "preset.json").write_text(json.dumps(meta, indent=2))


def ensure_preset(name: str, cache_dir: Path, seed: int = 0) -> Path:
    """The directory of preset `name` at init `seed`, building it on first use.

    The directory is `<cache_dir>/<name>-s<seed>-<fingerprint>`: a changed spec builds anew.

    Safe to call concurrently and repeatedly: each builder writes a private temporary directory,
    drops a marker file into it and renames it into place (atomic on one file system); a loser
    of the race discards its copy and uses the winner's. A directory without the marker is
    never returned.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}")
    cache_dir = Path(cache_dir)
    # The spec's fingerprint is part of the name, so changing a preset never reuses old builds.
    final = cache_dir / f"{name}-s{seed}-{fingerprint(name)}"
    if (final / MARKER).exists():
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = cache_dir / f".tmp-{name}-s{seed}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        build_preset(name, tmp, seed)
        if not (tmp / "config.json").exists():
            # save_pretrained skips writing on ranks other than 0 of a torch.distributed group.
            raise RuntimeError(f"preset {name!r}: the build wrote no config.json into {tmp} "
                               "(built on a torch.distributed rank other than 0?)")
        (tmp / MARKER).write_text(time.strftime("%Y-%m-%dT%H:%M:%S\n"))
        if final.exists() and not (final / MARKER).exists():
            # Left over by a builder that did not use this protocol: move it out of the way.
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / MARKER).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


_DTYPES = ("float32", "bfloat16", "float16")


def load_policy(path: str | Path, dtype: str = "float32", device: str = "cpu"
                ) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """(model, tokenizer) from a local directory, through `from_pretrained` for both.

    The tokenizer must be a fast one (TypeError otherwise): rollouts need exact character
    offsets, which only the Rust tokenizers give. It is set up for batched generation (left
    padding, a pad token).
    """
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {_DTYPES}, got {dtype!r}")
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path}: no config.json (not a saved model directory)")
    tok = load_tokenizer(path)  # AutoTokenizer, except where it would drop our tokenizer.json
    if tok.pad_token is None:
        # Many causal checkpoints ship without a pad token; any id works under the mask.
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    # transformers wraps `.to` in a decorator whose stub types the device as a model.
    model.to(device)  # type: ignore[arg-type]
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def n_params(model: torch.nn.Module) -> int:
    """Parameter count (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
