"""`mutualrl bench rounds`: round time of N policies trained together by `mutualrl up` on a
pool of fewer CPU units than policies, against running their steps one after another.

For each N, N tiny policies of different families and tokenizers (GPT-2 + byte BPE, Llama +
characters, Qwen2 + Unigram, Qwen2 + WordPiece) train under SGT through the real platform
(`mutualrl up`, MWRA's local worker offering `slots` threads). The round time is the pace of
the round barrier: the mean over rounds of the gap between the last policy finishing round k-1
and the last one finishing round k. The anchor is the same policies' steps one after another:
the sum of each policy's mean step time when it trains alone (one thread, no services).
ratio = round time / anchor; the target is <= 1 (N policies on fewer units cost no more than
their steps in sequence).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

PRESETS = ("gpt2-bpe", "llama-char", "qwen2-unigram", "qwen2-wordpiece")
CLI = [sys.executable, "-m", "mutualrl.cli"]


def _trainer(run_id: str, out: Path, n: int, rounds: int, local: bool, probe: str = "sgt",
             exchange: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "run_id": run_id, "seed": 0, "output_dir": str(out),
        "task": {"regime": "short", "skills": ["add", "sub", "rev", "sort"]},
        "grpo": {"group_size": 8, "prompts_per_round": 16, "rounds": rounds, "lr": 3e-4},
        "probe": {"kind": probe, "deadline_seconds": 5.0},
        "exchange": exchange or {},
        "eval": {"every": 0}, "checkpoint": {"every": 0, "keep": 1},
        "metrics": {"tensorboard": False, "progress": False},
        "services": {"local": local},
        "policies": [{"name": p, "preset": p} for p in PRESETS[:n]],
    }


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def barrier_round_time(times: dict[str, list[float]], skip: int) -> float:
    """Mean gap between consecutive round barriers (the last policy to finish each round),
    over rounds after the first `skip`."""
    n = min(len(t) for t in times.values())
    barrier = [max(t[k] for t in times.values()) for k in range(n)]
    gaps = [b - a for a, b in zip(barrier[skip:], barrier[skip + 1:], strict=False)]
    if not gaps:
        raise ValueError("too few rounds to measure a round time")
    return statistics.fmean(gaps)


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def solo_step_s(preset_n: int, out: Path, rounds: int, skip: int) -> float:
    """Mean step time of policy `preset_n` training alone (one thread, no services)."""
    name = PRESETS[preset_n]
    cfg = _trainer(f"solo-{name}", out, preset_n + 1, rounds, local=True)
    cfg["policies"] = [{"name": name, "preset": name, "threads": 1}]
    path = out / f"solo-{name}.yaml"
    path.write_text(yaml.safe_dump({"trainer": cfg}))
    subprocess.run([*CLI, "train", "-c", str(path), "--policy", name], check=True,
                   env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=1800)
    rows = _rows(out / f"solo-{name}" / name / "metrics.jsonl")[skip:]
    return statistics.fmean(r["step_s"] for r in rows)


def round_split(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Where a policy's rounds went, per round on average (metrics.jsonl): rollouts, the
    probe's reads and waits, diagnostics, and the rest (scoring, the update, the engine's
    sync); and the tokens the loss took."""
    def mean(key: str) -> float:
        return statistics.fmean(float(r.get(key, 0.0)) for r in rows) if rows else 0.0

    parts = {k: mean(k) for k in ("step_s", "rollout_s", "probe_s", "diag_s")}
    return {**parts, "update_s": parts["step_s"] - parts["rollout_s"] - parts["probe_s"]
            - parts["diag_s"], "loss_tokens": mean("tokens")}


def together(n: int, out: Path, rounds: int, skip: int, slots: int,
             short_pool: str = "auto", probe: str = "sgt",
             exchange: dict[str, Any] | None = None, tag: str = "") -> dict[str, Any]:
    """N policies through `mutualrl up` on `slots` CPU units: barrier round time, fallbacks."""
    run_id = f"bench-rounds-n{n}-{short_pool}{tag}"
    cfg = {"up": {"worker_slots": slots, "stop_grace": 30},
           "mwra": {"short_pool": short_pool},
           "trainer": _trainer(run_id, out, n, rounds, local=False, probe=probe,
                               exchange=exchange)}
    path = out / f"{run_id}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with (out / f"{run_id}.log").open("wb") as log:
        subprocess.run([*CLI, "up", "-c", str(path)], check=True, env=_env(), stdout=log,
                       stderr=subprocess.STDOUT, timeout=3600)
    rows = {p: _rows(out / run_id / p / "metrics.jsonl") for p in PRESETS[:n]}
    times = {p: [r["time"] for r in rs] for p, rs in rows.items()}
    return {
        "round_s": barrier_round_time(times, skip),
        "step_s": {p: statistics.fmean(r["step_s"] for r in rs[skip:]) for p, rs in rows.items()},
        "split_s": {p: round_split(rs[skip:]) for p, rs in rows.items()},
        "fallback_rounds": sum(r.get("fallback", 0.0) for rs in rows.values() for r in rs),
        "threads": sorted({r.get("threads", 0.0) for rs in rows.values() for r in rs}),
    }


def bench_rounds(ns: list[int], rounds: int, slots: int, out_dir: Path | None = None,
                 skip: int = 3, short_pool: str = "auto", log: Any = print) -> dict[str, Any]:
    """`short_pool` is MWRA's (`time-share` shows what turns cost when units are short)."""
    with tempfile.TemporaryDirectory(prefix="mutualrl-bench-rounds-") as tmp:
        out = Path(out_dir or tmp).resolve()
        out.mkdir(parents=True, exist_ok=True)
        solo: dict[str, float] = {}
        for i in range(max(ns)):
            solo[PRESETS[i]] = solo_step_s(i, out, rounds, skip)
            log(f"solo {PRESETS[i]}: {solo[PRESETS[i]]:.3f} s/step")
        results = []
        for n in ns:
            t0 = time.monotonic()
            got = together(n, out, rounds, skip, slots, short_pool)
            anchor = sum(solo[p] for p in PRESETS[:n])
            entry = {"n_policies": n, "units": slots, **got,
                     "sequential_s": anchor, "parallel_ideal_s": anchor / min(n, slots),
                     "ratio": got["round_s"] / anchor, "wall_s": time.monotonic() - t0}
            log(f"N={n} on {slots} units: round {got['round_s']:.3f} s, steps one after "
                f"another {anchor:.3f} s, ratio {entry['ratio']:.2f}, "
                f"fallback rounds {got['fallback_rounds']:.0f}")
            results.append(entry)
    return {"bench": "rounds", "rounds": rounds, "skip": skip, "short_pool": short_pool,
            "solo_step_s": solo,
            "results": results, "ratio": max(r["ratio"] for r in results),
            "load_avg": os.getloadavg()}
