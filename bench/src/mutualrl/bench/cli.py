"""`mutualrl bench ...`: one command per benchmark, each in its own module of this package.

A new benchmark adds a module here and one `_<name>(commands)` function to `BENCHES` below;
its handler imports the module, so `mutualrl --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from mutualrl.common.commands import Commands


def _emit(result: dict[str, object], path: str | None) -> str:
    """The result as JSON text, written to `path` too when one is given."""
    text = json.dumps(result, indent=2)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n", encoding="utf-8")
    return text


def _so_far(path: str | None) -> Callable[[dict[str, object]], None]:
    """Writes a run's figures so far to `path` as they come: a run cut short keeps what it
    measured."""

    def write(result: dict[str, object]) -> None:
        _emit(result, path)

    return write


def _see_bench(args: argparse.Namespace) -> int:
    if args.memory:
        from mutualrl.bench.attacks import run_attacks

        result = run_attacks(args.redis_url or os.environ.get("REDIS_URL")
                             or "redis://127.0.0.1:6379/0")
        print(_emit(result, args.json))
        return 0 if result["all_met"] else 1
    from mutualrl.bench.see import main as bench_main

    return bench_main(args)


def _see(commands: Commands) -> None:
    p = commands.add(["bench", "see"], "SEE Publish throughput against raw Redis pipelines "
                     "(same payloads, writers and batch size).", _see_bench)
    p.add_argument("--json", required=True, help="Write the figures to this JSON file.")
    p.add_argument("--memory", action="store_true",
                   help="Instead: the resident memory of SEE, MWRA and THL (each a serve "
                        "process with a secret) under unauthenticated, wrong-token, "
                        "foreign-scope and over-limit calls and under 8 concurrent accepted "
                        "maximal calls, against their targets (mutualrl.bench.attacks).")
    p.add_argument("--clients", type=int, default=4, help="Concurrent writer processes.")
    p.add_argument("--records", type=int, default=60_000,
                   help="Records per side in total (split over the clients); enough that the "
                        "raw side runs for most of a second.")
    p.add_argument("--batch", type=int, default=256, help="Records per Publish / pipeline.")
    p.add_argument("--tokens", type=int, default=300, help="Tokens per ROLLOUT record.")
    p.add_argument("--redis-url", default=None,
                   help="Redis URL (default $REDIS_URL, else redis://127.0.0.1:6379/0).")
    p.add_argument("--workers", type=int, default=1,
                   help="SEE server worker processes (see serve --workers).")
    p.add_argument("--cluster", action="store_true",
                   help="Both sides on a private Redis Cluster of 3 masters (needs redis-server "
                        "and redis-cli on PATH).")
    p.add_argument("--durability", choices=["default", "fsync"], default="default",
                   help="SEE's see.durability; fsync without --redis-url runs a private Redis "
                        "with appendfsync always (both sides).")
    p.add_argument("--repeats", type=int, default=3,
                   help="Run both sides this many times, back to back; the median of the "
                        "paired ratios is reported.")
    p.add_argument("--warmup", type=int, default=1,
                   help="Pairs run first and left out of every figure (listed under `warmup`): "
                        "the first pair on a Redis that has not held this much yet grows its "
                        "memory and skews that pair's ratio.")


def _thl_bench(args: argparse.Namespace) -> int:
    if args.memory:
        from mutualrl.bench.thl_memory import run_memory

        memory = run_memory(repeats=args.repeats)
        print(_emit(memory, args.json))
        return 0 if memory["within_bound"] else 1
    from mutualrl.bench.thl import run_bench

    result = run_bench(n_texts=args.texts, seed=args.seed, batch=args.batch,
                       repeats=args.repeats, source_kind=args.source, target_kind=args.target)
    print(_emit(result, args.json))
    return 0


def _thl(commands: Commands) -> None:
    p = commands.add(["bench", "thl"], "THL alignment throughput vs spacy-alignments; with "
                     "--memory, THL's peak memory on its largest input against its bound.",
                     _thl_bench)
    p.add_argument("--memory", action="store_true",
                   help="Measure a `mutualrl thl serve` process's peak RSS on 4 MiB of emoji, "
                        "one call and three at once, and its refusal times (exit 1 when a peak "
                        "passes the stated bound).")
    p.add_argument("--json", default=None, help="Write the result JSON here.")
    p.add_argument("--texts", type=int, default=2000, help="Texts in the corpus (>= 2000).")
    p.add_argument("--seed", type=int, default=0, help="Corpus and value seed.")
    p.add_argument("--batch", type=int, default=64, help="Items per align_batch call.")
    p.add_argument("--repeats", type=int, default=3,
                   help="Timed passes (the best is reported); --memory: runs of each scenario, "
                        "each in a fresh process (the median is reported).")
    p.add_argument("--source", default="byte_bpe", help="Source tokenizer kind.")
    p.add_argument("--target", default="wordpiece", help="Target tokenizer kind.")


def _mwra_bench(args: argparse.Namespace) -> int:
    from mutualrl.bench.mwra import compare

    costs: dict[str, float] = {}
    for item in args.costs.split(","):
        name, _, value = item.partition("=")
        costs[name.strip()] = float(value)
    report = compare(costs, args.units, rounds=args.rounds, noise=args.noise, seed=args.seed,
                     smoothing=args.smoothing, hysteresis=args.hysteresis)
    noiseless = compare(costs, args.units, rounds=args.rounds, noise=0.0, seed=args.seed,
                        smoothing=args.smoothing, hysteresis=args.hysteresis)
    out = {"bench": "mwra", "noisy": report, "noise_free": noiseless,
           "makespan_ratio_balanced_over_static": report["makespan_ratio_balanced_over_static"],
           "idle_fraction_static": report["static"]["idle_fraction"],
           "idle_fraction_balanced": report["balanced"]["idle_fraction"]}
    _emit(out, args.json)
    print(f"balanced/static makespan ratio {out['makespan_ratio_balanced_over_static']:.4f} "
          f"(noise-free {noiseless['makespan_ratio_balanced_over_static']:.4f}); idle fraction "
          f"static {out['idle_fraction_static']:.3f}, "
          f"balanced {out['idle_fraction_balanced']:.3f}")
    return 0


def _mwra(commands: Commands) -> None:
    p = commands.add(["bench", "mwra"], "Simulated rounds: makespan of `balanced` against "
                     "`static` equal shares, and idle fractions.", _mwra_bench)
    p.add_argument("--json", default=None, help="Write the figures to this JSON file.")
    p.add_argument("--costs", default="slow=3,fast=1",
                   help="Per-policy cost (unit-seconds per round): name=cost,...")
    p.add_argument("--units", type=int, default=8, help="Units in the pool.")
    p.add_argument("--rounds", type=int, default=200, help="Rounds to simulate.")
    p.add_argument("--noise", type=float, default=0.2, help="Lognormal sigma of step times.")
    p.add_argument("--seed", type=int, default=0, help="Noise seed.")
    p.add_argument("--smoothing", type=float, default=0.3, help="EMA weight of the newest cost.")
    p.add_argument("--hysteresis", type=float, default=0.1, help="Relative gain needed to move.")


def _trainer_bench(args: argparse.Namespace) -> int:
    from mutualrl.bench.trainer import run_bench

    result = run_bench(steps=args.steps, cache_dir=Path(args.cache_dir) if args.cache_dir else None,
                       threads=args.threads)
    print(_emit(result, args.json))
    return 0


def _trainer(commands: Commands) -> None:
    b = commands.add(("bench", "trainer"),
                     "Steps/s of our GRPO step vs TRL's GRPOTrainer on the same model.",
                     _trainer_bench)
    b.add_argument("--json", default=None, help="Write the result JSON here.")
    b.add_argument("--steps", type=int, default=8, help="Timed steps per side (+1 warm-up).")
    b.add_argument("--threads", type=int, default=2,
                   help="Threads of each side (>= 2 adds our overlapped trainer: a rollout "
                        "worker beside the learner, half the threads each).")
    b.add_argument("--cache-dir", default=None,
                   help="Preset cache (default: a temporary directory, built each run).")


def _memory_bench(args: argparse.Namespace) -> int:
    from mutualrl.bench.memory import run_bench

    print(_emit(run_bench(args), args.json))
    return 0


def _memory(commands: Commands) -> None:
    m = commands.add(("bench", "memory"),
                     "Peak RSS of one GRPO step at P and 2P prompts, ours vs TRL's GRPOTrainer "
                     "(Qwen2's vocabulary, random init).", _memory_bench)
    from mutualrl.bench.memory import add_arguments

    add_arguments(m)


def _rounds_bench(args: argparse.Namespace) -> int:
    from mutualrl.bench.probes import bench_probes
    from mutualrl.bench.rounds import bench_rounds

    out = Path(args.out) if args.out else None
    if args.overlap:
        from mutualrl.bench.overlap import CASES, bench_overlap

        cases = args.cases.split(",") if args.cases else list(CASES)
        unknown = [c for c in cases if c not in CASES]
        if unknown:
            print(f"mutualrl bench rounds: --cases: unknown {unknown}; expected some of "
                  f"{list(CASES)}", file=sys.stderr)
            return 2
        print(_emit(bench_overlap(cases, args.rounds, args.skip, args.repeats, args.slots,
                                  out), args.json))
        return 0
    if args.probes:
        if args.n is not None and "," in args.n:
            print(f"mutualrl bench rounds: --n {args.n}: with --probes, --n is one policy count",
                  file=sys.stderr)
            return 2
        res = bench_probes(args.probes.split(","), args.modes.split(","), int(args.n or 2),
                           args.rounds, args.slots, args.staleness, args.repeats, out)
    else:
        res = bench_rounds([int(n) for n in (args.n or "2,3,4").split(",")], args.rounds,
                           args.slots, out, short_pool=args.short_pool)
    print(_emit(res, args.json))
    return 0


def _rounds(commands: Commands) -> None:
    b = commands.add(["bench", "rounds"], "Round time of N policies through `mutualrl up` on "
                     "fewer CPU units than policies, against their steps one after another.",
                     _rounds_bench)
    b.add_argument("--n", default=None, help="Comma-separated policy counts (2-4; default "
                   "2,3,4); with --probes one count (default 2).")
    b.add_argument("--rounds", type=int, default=30, help="Rounds per run.")
    b.add_argument("--slots", type=int, default=2, help="CPU units MWRA's worker offers.")
    b.add_argument("--short-pool", default="auto",
                   choices=["auto", "shared", "time-share", "share"],
                   help="MWRA's mwra.short_pool (time-share: the turns MWRA used to take; "
                        "share: the earlier name of shared).")
    b.add_argument("--probes", default=None, help="Comma-separated probes (e.g. none,sgt,prp): "
                   "their round times against GRPO's, same policies and seed (--n: one count).")
    b.add_argument("--modes", default="deterministic,asynchronous",
                   help="With --probes: the exchange modes to run.")
    b.add_argument("--staleness", type=int, default=1, help="With --probes: exchange.staleness.")
    b.add_argument("--repeats", type=int, default=1, help="With --probes: interleaved repeats.")
    b.add_argument("--overlap", action="store_true",
                   help="One policy's round time with its rollouts in-process against a "
                        "rollout worker beside the update (d = 1), --slots threads in all.")
    b.add_argument("--cases", default=None,
                   help="With --overlap: comma-separated cases (default: all).")
    b.add_argument("--skip", type=int, default=2,
                   help="With --overlap: first rounds of a run left out (start, warm-up).")
    b.add_argument("--out", default=None, help="Keep the runs here (default: a temp dir).")
    b.add_argument("--json", default=None, help="Write the result JSON here.")


def _rollout_bench(args: argparse.Namespace) -> int:
    from mutualrl.bench.rollout import run_bench

    engines = args.engines.split(",") if args.engines else None
    print(_emit(run_bench(args.prompts, args.group, args.new_tokens, args.repeats, args.threads,
                          args.cache_dir, device=args.device, shape=args.shape,
                          engines=engines, bandwidth_tbps=args.bandwidth_tbps,
                          progress=_so_far(args.json)), args.json))
    return 0


def _rollout(commands: Commands) -> None:
    r = commands.add(("bench", "rollout"), "Rollout tokens/s of the HF engine's fast path "
                     "against its dynamic-cache loop, transformers' generate, vLLM and SGLang "
                     "(CPU or CUDA; real model shapes).", _rollout_bench)
    from mutualrl.bench.rollout import add_arguments

    add_arguments(r)


def _shape_bench(args: argparse.Namespace) -> int:
    from mutualrl.bench.shape import run_shape, write_run

    if args.write_run is not None:
        print(write_run(args.shape, args.write_run, args.device, args.prompts, args.group,
                        args.new_tokens, {"fast_path": args.fast_path == "true"}))
        return 0

    print(_emit(run_shape(args.shape, args.device, args.rounds, args.prompts, args.group,
                          args.new_tokens, args.cache_dir,
                          {"fast_path": args.fast_path == "true"}, _so_far(args.json),
                          args.max_off_policy_steps), args.json))
    return 0


def _shape(commands: Commands) -> None:
    r = commands.add(("bench", "shape"), "Training rounds of one policy at a real model's shape "
                     "(random init): round and rollout time, and the memory plan against the "
                     "measured peak.", _shape_bench)
    from mutualrl.bench.shape import add_arguments

    add_arguments(r)


BENCHES: tuple[Callable[[Commands], None], ...] = (_see, _thl, _mwra, _trainer, _memory, _rounds,
                                                   _rollout, _shape)


def register(commands: Commands) -> None:
    commands.group(["bench"], "Benchmarks (each figure a ratio against an anchor).")
    for add in BENCHES:
        add(commands)
