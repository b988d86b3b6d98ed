"""`mutualrl bench memory`: peak memory of one GRPO training step at P and 2P prompts, ours
against TRL's `GRPOTrainer`, on the same model and the same data, in the same run.

- Model: random init, Qwen2 architecture with Qwen2's vocabulary size (151,936) and a small
  body, so the LM head and the log-softmax over the vocabulary dominate memory as they do for
  real checkpoints. Its tokenizer has one token per character over 151,932 code points (built
  offline with `tokenizers`), so every sampled id decodes.
- Step: G=8 samples of P prompts (then 2P), `new_tokens` new tokens (EOS is one id in 151,936:
  completions run to the budget on both sides), graded reward, one optimizer step.
- Ours: probe `none`, no services, micro-batches of `micro_batch_tokens` and logit chunks of
  `logit_chunk_tokens`. TRL: in-process `GRPOTrainer` with HF generate on the CPU, fp32, no
  vLLM, the same lr / clip / loss type; gradient checkpointing as ours (off unless asked).
- Each (side, P) runs in a fresh subprocess, so peaks never mix; the peak is the process's
  maximum RSS (getrusage), which includes loading the model and the libraries: `base_rss_mb`
  (RSS before the first step) says how much of it is baseline. Steps/s times the last step (the
  first is a warm-up when `steps` > 1). With `repeats` > 1 every figure is the median.
- Both timed windows hold the same work: generation of the G x P completions, rewards, the
  loss forward and backward and one optimizer step (TRL: `on_step_begin` to `on_step_end`,
  whose `training_step` generates in `_prepare_inputs`; ours: `run_round`).
- Each process runs one torch thread, so its CPU seconds for the step (`step_cpu_s`, process
  time) measure the work whatever else the machine runs; wall seconds (`step_s`) are
  stretched by load, and a shared machine's load changes between configurations run minutes
  apart. Steps/s is reported both ways, and the configurations run interleaved (ours and TRL
  at P, then both at 2P) so that each comparison is made at nearly the same load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

QWEN2_VOCAB = 151_936
BODY: dict[str, Any] = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2,
                            max_position_embeddings=2048, tie_word_embeddings=True)
"""The small body under Qwen2's vocabulary (about 9.8 M parameters, 9.7 M of them the
embedding)."""
GROUP, LR, PROMPT_CHARS = 8, 1e-5, 16
FIRST_CHAR = 0x10000  # supplementary planes: 151,932 code points with no surrogates among them


def build_model(out: Path, seed: int = 0) -> Path:
    """Save the random-init Qwen2-vocabulary model and its character tokenizer to `out`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mutualrl.thl.tokenizers import SPECIALS, train_tokenizer

    if (out / "config.json").exists():
        return out
    alphabet = "".join(chr(FIRST_CHAR + i) for i in range(QWEN2_VOCAB - len(SPECIALS)))
    tok = train_tokenizer("char", [alphabet[:64]], QWEN2_VOCAB, alphabet=alphabet)
    if len(tok) != QWEN2_VOCAB:
        raise RuntimeError(f"tokenizer has {len(tok)} tokens, expected {QWEN2_VOCAB}")
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=QWEN2_VOCAB, pad_token_id=tok.pad_token_id,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, **BODY)
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def prompt_texts(n: int, seed: int) -> list[str]:
    """`n` prompts of PROMPT_CHARS characters of the model's alphabet (the same for both)."""
    import random

    rng = random.Random(f"bench-memory:{seed}")
    return ["".join(chr(FIRST_CHAR + rng.randrange(QWEN2_VOCAB - 8)) for _ in range(PROMPT_CHARS))
            for _ in range(n)]


def even_share(text: str) -> float:
    """A graded reward with variance on a random policy: share of even code points."""
    return sum(ord(c) % 2 == 0 for c in text) / max(len(text), 1)


def _rss_mb() -> float:
    import psutil

    return float(psutil.Process().memory_info().rss) / 2**20


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


class _Task:
    """The bench's task for our trainer: fixed prompts, the graded reward, stop at EOS only."""

    def __init__(self, prompts: list[str], new_tokens: int) -> None:
        from mutualrl.trainer.data.tasks import Prompt

        self._prompts = [Prompt(id=f"b{i}", skill="bench", text=t, answer="")
                         for i, t in enumerate(prompts)]
        self.stop: list[str] = []
        self.max_new_tokens = new_tokens
        self.skills = ("bench",)

    def round_prompts(self, round_k: int, n: int, seed: int) -> list[Any]:
        return [self._prompts[(round_k * n + i) % len(self._prompts)] for i in range(n)]

    def reward(self, prompt: Any, text: str, finish_reason: str) -> float:
        return even_share(text)

    def is_correct(self, prompt: Any, text: str, finish_reason: str) -> bool:
        return False


def child_ours(model_dir: Path, prompts: int, new_tokens: int, steps: int, seed: int,
               micro_batch_tokens: int, logit_chunk_tokens: int, checkpointing: bool
               ) -> dict[str, float]:
    """One configuration of ours in this (fresh) process."""
    import torch

    from mutualrl.trainer.config.run import TrainerConfig
    from mutualrl.trainer.runtime.loop import run_round
    from mutualrl.trainer.runtime.session import build_session

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="mutualrl-bench-memory-") as tmp:
        cfg = TrainerConfig.model_validate({
            "run_id": "bench-memory", "seed": seed, "output_dir": tmp,
            "services": {"local": True},
            "grpo": {"group_size": GROUP, "prompts_per_round": prompts, "lr": LR,
                     "max_new_tokens": new_tokens, "rounds": 10**6,
                     "micro_batch_tokens": micro_batch_tokens,
                     "logit_chunk_tokens": logit_chunk_tokens,
                     "activation_checkpointing": checkpointing},
            "eval": {"every": 0}, "checkpoint": {"every": 0},
            "metrics": {"tensorboard": False, "progress": False},
            "policies": [{"name": "ours", "model_path": str(model_dir)}]})
        s = build_session(cfg, "ours")
        s.task = _Task(prompt_texts(prompts * steps, seed), new_tokens)  # type: ignore[assignment]
        base = _rss_mb()
        times, cpu = [], []
        for k in range(steps):
            t0, c0 = time.perf_counter(), time.process_time()
            run_round(s, k)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        s.close()
    return {"peak_rss_mb": _peak_rss_mb(), "base_rss_mb": base, "step_s": times[-1],
            "step_cpu_s": cpu[-1]}


def child_trl(model_dir: Path, prompts: int, new_tokens: int, steps: int, seed: int,
              checkpointing: bool) -> dict[str, float]:
    """One configuration of TRL's GRPOTrainer in this (fresh) process."""
    import torch
    from transformers import TrainerCallback

    from mutualrl.bench.trainer import trl_trainer

    torch.set_num_threads(1)
    times: list[float] = []
    cpu: list[float] = []

    class Timer(TrainerCallback):
        t0 = c0 = 0.0

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            times.append(time.perf_counter() - self.t0)
            cpu.append(time.process_time() - self.c0)

    with tempfile.TemporaryDirectory(prefix="mutualrl-bench-memory-trl-") as tmp:
        trainer = trl_trainer(model_dir, Path(tmp), seed, steps,
                              prompt_texts(prompts * steps, seed), Timer(), even_share,
                              rows=prompts * GROUP, group=GROUP, new_tokens=new_tokens, lr=LR,
                              checkpointing=checkpointing)
        base = _rss_mb()
        trainer.train()
    return {"peak_rss_mb": _peak_rss_mb(), "base_rss_mb": base, "step_s": times[-1],
            "step_cpu_s": cpu[-1]}


def _run_child(side: str, model_dir: Path, prompts: int, a: argparse.Namespace
               ) -> dict[str, float]:
    cmd = [sys.executable, "-m", "mutualrl.bench.memory", "--child", side,
           "--model", str(model_dir), "--prompts", str(prompts),
           "--new-tokens", str(a.new_tokens), "--steps", str(a.steps), "--seed", str(a.seed),
           "--micro-batch-tokens", str(a.micro_batch_tokens),
           "--logit-chunk-tokens", str(a.logit_chunk_tokens)]
    if a.checkpointing:
        cmd.append("--checkpointing")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"bench child {side} P={prompts} failed:\n{proc.stderr[-4000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def run_bench(a: argparse.Namespace) -> dict[str, Any]:
    """Every (side, P) in its own subprocess, `repeats` times, medians reported."""
    import os

    from mutualrl.trainer.runtime.presets import n_params

    cache = Path(a.cache_dir) if a.cache_dir else Path(tempfile.mkdtemp(
        prefix="mutualrl-bench-memory-"))
    model_dir = build_model(cache / "qwen2-vocab-random", a.seed)
    runs: dict[str, list[dict[str, float]]] = {}
    for _ in range(a.repeats):
        for mult in (1, 2):  # interleaved: each side's pair runs at nearly the same load
            for side in ("ours", "trl"):
                runs.setdefault(f"{side}_{mult}", []).append(
                    _run_child(side, model_dir, a.prompts * mult, a))

    def med(key: str, field: str) -> float:
        return statistics.median(r[field] for r in runs[key])

    from transformers import AutoConfig, AutoModelForCausalLM

    params = n_params(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir)))
    load = os.getloadavg()
    return {
        "benchmark": "memory",
        "model": "qwen2-vocab-random", "vocab_size": QWEN2_VOCAB, "params": params,
        "group_size": GROUP, "prompts": a.prompts, "prompts_2x": 2 * a.prompts,
        "new_tokens": a.new_tokens, "steps": a.steps, "repeats": a.repeats, "threads": 1,
        "micro_batch_tokens": a.micro_batch_tokens, "logit_chunk_tokens": a.logit_chunk_tokens,
        "checkpointing": a.checkpointing,
        "peak_rss_mb": med("ours_1", "peak_rss_mb"),
        "peak_rss_mb_2x": med("ours_2", "peak_rss_mb"),
        "trl_peak_rss_mb": med("trl_1", "peak_rss_mb"),
        "trl_peak_rss_mb_2x": med("trl_2", "peak_rss_mb"),
        "base_rss_mb": med("ours_1", "base_rss_mb"),
        "trl_base_rss_mb": med("trl_1", "base_rss_mb"),
        "steps_per_s": 1.0 / med("ours_1", "step_s"),
        "trl_steps_per_s": 1.0 / med("trl_1", "step_s"),
        "steps_per_s_cpu": 1.0 / med("ours_1", "step_cpu_s"),
        "trl_steps_per_s_cpu": 1.0 / med("trl_1", "step_cpu_s"),
        "steps_per_s_2x": 1.0 / med("ours_2", "step_s"),
        "trl_steps_per_s_2x": 1.0 / med("trl_2", "step_s"),
        "ratio_memory": med("ours_2", "peak_rss_mb") / med("trl_2", "peak_rss_mb"),
        "growth": med("ours_2", "peak_rss_mb") / med("ours_1", "peak_rss_mb"),
        "load_avg_1m_5m_15m": list(load),
        "anchor": "trl.GRPOTrainer (HF generate, use_cpu, fp32), same model and prompts, "
                  "each configuration in a fresh subprocess, ours and TRL interleaved; timed: "
                  "generation + rewards + loss + backward + one optimizer step on both sides",
        "runs": runs,
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", default=None, help="Write the result JSON here.")
    p.add_argument("--prompts", type=int, default=4, help="P (the second run uses 2P).")
    p.add_argument("--new-tokens", type=int, default=256, help="Completion tokens per sample.")
    p.add_argument("--steps", type=int, default=1,
                   help="Steps per configuration (the last is timed; peaks cover all).")
    p.add_argument("--repeats", type=int, default=1, help="Runs per configuration (median).")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--micro-batch-tokens", type=int, default=4096,
                   help="Ours: grpo.micro_batch_tokens.")
    p.add_argument("--logit-chunk-tokens", type=int, default=128,
                   help="Ours: grpo.logit_chunk_tokens.")
    p.add_argument("--checkpointing", action="store_true",
                   help="Activation checkpointing on both sides.")
    p.add_argument("--cache-dir", default=None,
                   help="Where the random model is saved (default: a temporary directory).")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the per-configuration subprocesses (`--child ours|trl`)."""
    p = argparse.ArgumentParser(prog="python -m mutualrl.bench.memory")
    p.add_argument("--child", choices=("ours", "trl"), required=True)
    p.add_argument("--model", type=Path, required=True)
    add_arguments(p)
    a = p.parse_args(argv)
    if a.child == "ours":
        res = child_ours(a.model, a.prompts, a.new_tokens, a.steps, a.seed,
                         a.micro_batch_tokens, a.logit_chunk_tokens, a.checkpointing)
    else:
        res = child_trl(a.model, a.prompts, a.new_tokens, a.steps, a.seed, a.checkpointing)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
