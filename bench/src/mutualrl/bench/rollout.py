"""`mutualrl bench rollout`: rollout tokens/s of the HF engine and vLLM on the same model and
prompts, in one run, with the time of one weight sync and each engine's peak memory.

- Model: random init, a ~100 M-parameter Llama shape (hidden 512, 8 layers, 8 heads of 64,
  ffn 1536, tied) under Qwen2's vocabulary size (151,936: the LM head and the sampling over the
  vocabulary cost what they cost on real checkpoints), with a one-token-per-character tokenizer
  over 151,932 code points built offline (`bench memory`'s), so every id decodes.
- Work: `prompts` prompts x `group` samples (64 sequences by default) x `new_tokens` new
  tokens at temperature 1, per-prompt seeds, behaviour log-probs returned; EOS is one id in
  151,936, so completions nearly always run to the budget (tokens/s counts the tokens made).
- Both engines run in this process on the same torch threads; each is warmed up by one call
  that is not timed, then `repeats` timed calls alternate (HF, vLLM, HF, ...) so drifting
  machine load hits both; every figure is the median over repeats. vLLM's weight sync copies
  the trainer's float32 parameters into the engine (`sync_weights`); the HF engine samples
  from the trainer's module itself, so its sync is free (reported as 0).
- Peak RSS is the largest resident set sampled while each engine's calls ran (one process:
  both include the trainer's own copy of the model, which a colocated engine lives beside).
- The matmul bound: the dense float32 matmuls of one decoding step of every sequence at once
  (per layer q, k, v, o and the three MLP projections; the LM head), timed alone on random
  tensors with the same threads. An engine on torch's matmul kernels cannot decode faster
  than `sequences / that time` tokens/s at this shape and dtype (attention over the cache,
  sampling and log-probs come on top), so `ratio_ceiling`, that bound over the HF engine's
  tokens/s, is the largest speed-up such an engine could show here; faster kernels of an
  engine's own would show as a share of the bound above 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

QWEN2_VOCAB = 151_936
BODY: dict[str, Any] = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                            num_attention_heads=8, num_key_value_heads=8,
                            max_position_embeddings=1024, tie_word_embeddings=True)
"""~105 M parameters: 77.8 M of embedding (tied head) and 27.3 M of body."""
PROMPT_CHARS = 16


def build_model(out: Path, seed: int = 0) -> Path:
    """Save the random-init Llama with Qwen2's vocabulary and its character tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from mutualrl.bench.memory import FIRST_CHAR
    from mutualrl.thl.tokenizers import SPECIALS, train_tokenizer

    if (out / "config.json").exists():
        return out
    alphabet = "".join(chr(FIRST_CHAR + i) for i in range(QWEN2_VOCAB - len(SPECIALS)))
    tok = train_tokenizer("char", [alphabet[:64]], QWEN2_VOCAB, alphabet=alphabet)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, **BODY)
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def matmul_bound(sequences: int, repeats: int = 7) -> dict[str, float]:
    """Tokens/s of one decoding step's dense matmuls alone (median of `repeats`), and the
    share the LM head takes of their time."""
    import torch

    h, ffn, layers = BODY["hidden_size"], BODY["intermediate_size"], BODY["num_hidden_layers"]
    x = torch.randn(sequences, h)
    square = torch.randn(h, h) * 0.02
    up, down = torch.randn(h, ffn) * 0.02, torch.randn(ffn, h) * 0.02
    head = torch.randn(h, QWEN2_VOCAB) * 0.02

    def body() -> None:
        y = x
        for _ in range(layers):
            for _ in range(4):  # q, k, v, o
                y = y @ square
            y = (torch.nn.functional.silu(y @ up) * (y @ up)) @ down  # gate, up, down

    def timed(fn: Any) -> float:
        fn()
        walls = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            walls.append(time.perf_counter() - t)
        return statistics.median(walls)

    with torch.no_grad():
        body_s = timed(body)
        head_s = timed(lambda: x @ head)
    return {"matmul_bound_tokens_per_s": sequences / (body_s + head_s),
            "matmul_step_s": body_s + head_s, "lm_head_share": head_s / (body_s + head_s)}


def run_bench(prompts: int = 8, group: int = 8, new_tokens: int = 128, repeats: int = 3,
              threads: int | None = None, cache_dir: Path | None = None,
              seed: int = 0) -> dict[str, Any]:
    """The figures of one run (see the module docstring)."""
    import torch

    from mutualrl.bench.memory import prompt_texts
    from mutualrl.bench.trainer import _RssPeaks
    from mutualrl.trainer.engines.hf import HFEngine
    from mutualrl.trainer.engines.vllm import VLLMEngine
    from mutualrl.trainer.runtime.presets import load_policy, n_params

    threads = threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    load0 = os.getloadavg()
    model_dir = build_model((cache_dir or Path(tempfile.mkdtemp(prefix="mutualrl-bench-")))
                            / "llama-qwen2vocab")
    model, tok = load_policy(model_dir)
    texts = prompt_texts(prompts, seed)
    seeds = list(range(seed, seed + prompts))
    engines: dict[str, Any] = {"hf": HFEngine(model, tok)}
    results: dict[str, dict[str, list[float]]] = {}
    with _RssPeaks() as rss:
        rss.phase = "vllm"
        t0 = time.perf_counter()
        engines["vllm"] = VLLMEngine(str(model_dir), tok, policy="bench", dtype="float32",
                                     seed=seed, kv_cache_gib=1.0)
        start_s = time.perf_counter() - t0

        def call(name: str) -> tuple[float, int]:
            rss.phase = name
            t = time.perf_counter()
            out = engines[name].generate(texts, n=group, max_new_tokens=new_tokens,
                                         temperature=1.0, seeds=seeds)
            wall = time.perf_counter() - t
            return wall, sum(len(s.token_ids) for row in out for s in row)

        for name in engines:  # warm-up, not timed
            call(name)
        for _ in range(repeats):
            for name in engines:
                wall, tokens = call(name)
                r = results.setdefault(name, {"tokens_per_s": [], "wall_s": [], "tokens": [],
                                              "sync_s": []})
                r["tokens_per_s"].append(tokens / wall)
                r["wall_s"].append(wall)
                r["tokens"].append(float(tokens))
                t = time.perf_counter()
                engines[name].sync_weights(model)
                r["sync_s"].append(0.0 if name == "hf" else time.perf_counter() - t)
    engines["vllm"].close()
    bound = matmul_bound(prompts * group)
    med = {name: {k: statistics.median(v) for k, v in r.items()} for name, r in results.items()}
    return {
        "benchmark": "rollout",
        "model": "llama, hidden 512, 8 layers, 8 heads x 64, ffn 1536, tied",
        "params": n_params(model), "vocab": len(tok),
        "sequences": prompts * group, "prompts": prompts, "group_size": group,
        "new_tokens": new_tokens, "repeats": repeats, "threads": threads, "dtype": "float32",
        **{f"{name}_{k}": v for name, m in med.items() for k, v in m.items()},
        **{f"{name}_peak_rss_mb": rss.peak.get(name, 0) / 2**20 for name in engines},
        "vllm_start_s": start_s,
        "ratio": med["vllm"]["tokens_per_s"] / med["hf"]["tokens_per_s"],
        **bound,
        "ratio_ceiling": bound["matmul_bound_tokens_per_s"] / med["hf"]["tokens_per_s"],
        **{f"{name}_share_of_bound": m["tokens_per_s"] / bound["matmul_bound_tokens_per_s"]
           for name, m in med.items()},
        "runs": results,
        "load_start": list(load0), "load_end": list(os.getloadavg()),
        "anchor": "HFEngine (our KV-cached sampling loop) on the same model, prompts, seeds "
                  "and threads, alternating call by call",
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", default=None, help="Write the result JSON here.")
    p.add_argument("--prompts", type=int, default=8, help="Prompts per call.")
    p.add_argument("--group", type=int, default=8, help="Samples per prompt.")
    p.add_argument("--new-tokens", type=int, default=128, help="New tokens per sample.")
    p.add_argument("--repeats", type=int, default=3, help="Timed calls per engine (median).")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: every CPU this process may use).")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="Where the model is built (default: a temporary directory).")
