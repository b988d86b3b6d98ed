"""`mutualrl bench rounds --probes none,sgt,prp,hacpo,sapo`: what sharing costs in round time.

The same N tiny policies (`bench.PRESETS`), seed and pool train once per probe and exchange
mode through `mutualrl up`; each run's round time is the pace of the round barrier
(`bench.barrier_round_time`). The anchor is probe `none` (plain GRPO, which shares nothing)
in the same mode and repeat: ratio = round time of the probe / round time of GRPO. Repeats
interleave the runs (mode by mode, probe by probe) so that drift in machine load hits every
probe alike; figures are medians over repeats. Targets, deterministic mode with staleness 1:
SGT/GRPO <= 1.05, PRP/GRPO <= 1.3, and the same 1.3 for HACPO, SAPO and F-TIS, which read and
score peer rows as PRP does.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from mutualrl.bench.rounds import together

TARGETS = {"sgt": 1.05, "prp": 1.3, "hacpo": 1.3, "sapo": 1.3, "ftis": 1.3}
"""Round-time ratio to GRPO each probe should stay within (deterministic mode, s = 1)."""


def mean_split(per_policy: dict[str, dict[str, float]]) -> dict[str, float]:
    """The policies' round splits (`rounds.round_split`), averaged over the policies."""
    keys = next(iter(per_policy.values()))
    return {k: statistics.fmean(s[k] for s in per_policy.values()) for k in keys}


def bench_probes(probes: list[str], modes: list[str], n: int, rounds: int, slots: int,
                 staleness: int = 1, repeats: int = 1, out_dir: Path | None = None,
                 skip: int = 3, log: Any = print) -> dict[str, Any]:
    if "none" not in probes:
        probes = ["none", *probes]  # the anchor
    load_start = os.getloadavg()
    t_start = time.monotonic()
    runs: dict[str, dict[str, list[float]]] = {m: {p: [] for p in probes} for m in modes}
    splits: dict[str, dict[str, list[dict[str, float]]]] = {m: {p: [] for p in probes}
                                                            for m in modes}
    fallbacks: dict[str, dict[str, float]] = {m: dict.fromkeys(probes, 0.0) for m in modes}
    with tempfile.TemporaryDirectory(prefix="mutualrl-bench-probes-") as tmp:
        out = Path(out_dir or tmp).resolve()
        out.mkdir(parents=True, exist_ok=True)
        for rep in range(repeats):
            for mode in modes:
                exchange = {"mode": mode, "staleness": staleness}
                for probe in probes:
                    got = together(n, out, rounds, skip, slots, probe=probe, exchange=exchange,
                                   tag=f"-{mode[:3]}-{probe}-r{rep}")
                    runs[mode][probe].append(got["round_s"])
                    splits[mode][probe].append(mean_split(got["split_s"]))
                    fallbacks[mode][probe] += got["fallback_rounds"]
                    log(f"repeat {rep} {mode} {probe}: round {got['round_s']:.3f} s, "
                        f"fallback rounds {got['fallback_rounds']:.0f}")
    results: dict[str, dict[str, Any]] = {}
    ratio_of: dict[str, dict[str, float]] = {}
    for mode in modes:
        median = {p: statistics.median(v) for p, v in runs[mode].items()}
        # per repeat against the same repeat's GRPO, then the median of those ratios
        ratios = {p: statistics.median(a / b for a, b in zip(runs[mode][p], runs[mode]["none"],
                                                             strict=True))
                  for p in probes if p != "none"}
        ratio_of[mode] = ratios
        split = {p: {k: statistics.median(s[k] for s in v) for k in v[0]}
                 for p, v in splits[mode].items() if v}
        results[mode] = {"round_s": median, "round_s_repeats": runs[mode], "ratio": ratios,
                         "fallback_rounds": fallbacks[mode], "split_s": split}
        for p, s in split.items():
            log(f"{mode} {p}: per policy and round, rollout {s['rollout_s']:.3f} s, probe "
                f"{s['probe_s']:.3f} s, diagnostics {s['diag_s']:.3f} s, update and rest "
                f"{s['update_s']:.3f} s; loss tokens {s['loss_tokens']:.0f}")
        log(f"{mode}: " + ", ".join(f"{p.upper()}/GRPO {r:.3f}" for p, r in ratios.items()))
    det = ratio_of.get("deterministic", {})
    return {
        "bench": "rounds-probes", "n_policies": n, "rounds": rounds, "skip": skip,
        "slots": slots, "staleness": staleness, "repeats": repeats, "results": results,
        "targets": {p: {"ratio_max": t, "deterministic": det.get(p),
                        "met": det[p] <= t if p in det else None}
                    for p, t in TARGETS.items()},
        "wall_s": time.monotonic() - t_start,
        "load_avg": {"start": load_start, "end": os.getloadavg()},
    }
