"""Model shapes the GPU benchmarks run at, random-initialised (nothing is downloaded): real
checkpoints' architectures, sizes and vocabularies, with a one-token-per-character tokenizer
over as many code points as the vocabulary holds (printable ASCII and newline first, so the
synthetic tasks' prompts and answers tokenize; then code points from U+10000), so every
sampled id decodes.

| shape | architecture (the head tied but in qwen2.5-7b) | parameters | vocabulary |
|---|---|---|---|
| `tiny` | Llama, hidden 512, 8 layers, 8 heads of 64, ffn 1536 | ~105 M | 151,936 |
| `qwen2.5-1.5b` | Qwen2: hidden 1536, 28 layers, 12 heads / 2 KV, ffn 8960 | 1.54 B | 151,936 |
| `llama-3.2-1b` | Llama: hidden 2048, 16 layers, 32 heads / 8 KV, ffn 8192 | 1.24 B | 128,256 |
| `qwen2.5-7b` | Qwen2: hidden 3584, 28 layers, 28 heads / 4 KV, ffn 18944 | 7.62 B | 152,064 |

`write_config` saves a shape's config and tokenizer alone (no weights): enough for the memory
plan (`mutualrl train --dry-run`), which reads configs only.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIRST_CHAR = 0x10000
"""The tokenizers' alphabet continues here after ASCII (supplementary planes: no surrogates
among them); the bench's prompts are drawn from this part."""
ASCII = "".join(chr(c) for c in range(32, 127)) + "\n"


@dataclass(frozen=True)
class Shape:
    family: str
    vocab: int
    body: dict[str, Any]


SHAPES: dict[str, Shape] = {
    "tiny": Shape("llama", 151_936, dict(
        hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
        num_key_value_heads=8, max_position_embeddings=1024, tie_word_embeddings=True)),
    "qwen2.5-1.5b": Shape("qwen2", 151_936, dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
        rope_theta=1_000_000.0)),
    "llama-3.2-1b": Shape("llama", 128_256, dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, max_position_embeddings=4096,
        tie_word_embeddings=True, rope_theta=500_000.0)),
    "qwen2.5-7b": Shape("qwen2", 152_064, dict(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, max_position_embeddings=32768, tie_word_embeddings=False,
        rope_theta=1_000_000.0)),
}


def tokenizer(vocab: int, cache_dir: Path) -> Any:
    """The character tokenizer of `vocab` ids (built once per size into `cache_dir`)."""
    from mutualrl.thl.tokenizers import SPECIALS, load_tokenizer, train_tokenizer

    out = cache_dir / f"char-{vocab}"
    if (out / "tokenizer.json").exists():
        tok = load_tokenizer(out)
    else:
        alphabet = ASCII + "".join(chr(FIRST_CHAR + i)
                                   for i in range(vocab - len(SPECIALS) - len(ASCII)))
        tok = train_tokenizer("char", ["add:37+58=95"], vocab, alphabet=alphabet)
        tok.save_pretrained(out)
    if len(tok) != vocab:
        raise RuntimeError(f"tokenizer has {len(tok)} tokens, expected {vocab}")
    tok.padding_side = "left"
    return tok


def _config(shape: str, tok: Any) -> tuple[Any, Any]:
    """(the shape's transformers config, its model class)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    spec = SHAPES[shape]
    config_cls, model_cls = ((Qwen2Config, Qwen2ForCausalLM) if spec.family == "qwen2"
                             else (LlamaConfig, LlamaForCausalLM))  # type: Any, Any
    cfg = config_cls(vocab_size=spec.vocab, pad_token_id=tok.pad_token_id,
                     bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, **spec.body)
    return cfg, model_cls


def write_config(shape: str, cache_dir: Path, out: Path) -> Path:
    """`out` holding the shape's config.json and tokenizer, no weights."""
    tok = tokenizer(SHAPES[shape].vocab, cache_dir)
    cfg, _ = _config(shape, tok)
    cfg.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def build(shape: str, cache_dir: Path, device: str = "cpu", seed: int = 0,
          save: Path | None = None) -> tuple[Any, Any]:
    """(float32 model on `device`, tokenizer) of `shape`, random init from `seed`; with `save`,
    also written there (engines that load a directory: vLLM, SGLang)."""
    import torch

    tok = tokenizer(SHAPES[shape].vocab, cache_dir)
    cfg, model_cls = _config(shape, tok)
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_cls(cfg)
    model.generation_config.pad_token_id = tok.pad_token_id
    if save is not None and not (save / "config.json").exists():
        model.save_pretrained(save)
        tok.save_pretrained(save)
    return model, tok


def prompts(shape: str, n: int, chars: int, seed: int) -> list[str]:
    """`n` prompts of `chars` characters of the shape's alphabet."""
    rng = random.Random(f"bench-shape:{shape}:{seed}")
    top = SHAPES[shape].vocab - 16 - len(ASCII)
    return ["".join(chr(FIRST_CHAR + rng.randrange(top)) for _ in range(chars))
            for _ in range(n)]
