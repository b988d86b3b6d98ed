"""The stability-support trade-off, per arm and policy, from per-round metrics.

*Support*: `support_logp`, the mean per-token log-prob a policy assigns (before its step) to
peers' verified successes on prompts it failed that round. Rising support means the policy is
moving towards what its peers can do.

*Stability*: `kl_warm` (per-token KL to the warm start on own samples), how well the skills it
was warm-started on are kept (held-out reward@1 on its strong skills against the warm start),
and the variance of the gradient norm (`grad_norm`, before clipping) in windows of rounds.

Pure: plain dicts in, plain dicts out (curves binned by round, means over seeds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from mutualrl.experiment.stats import mean_ci

Row = dict[str, Any]
HELD = "heldout/"


def binned(rows: Sequence[Row], key: str, width: int) -> dict[int, float]:
    """Mean of `key` over rounds [b*width, (b+1)*width) -> keyed by the bin's last round + 1."""
    sums: dict[int, list[float]] = {}
    for r in rows:
        if key in r:
            sums.setdefault(int(r["round"]) // width, []).append(float(r[key]))
    return {(b + 1) * width: math.fsum(v) / len(v) for b, v in sorted(sums.items())}


def windowed_variance(rows: Sequence[Row], key: str, width: int) -> dict[int, float]:
    """Variance (ddof 0) of `key` within each window of `width` rounds."""
    vals: dict[int, list[float]] = {}
    for r in rows:
        if key in r:
            vals.setdefault(int(r["round"]) // width, []).append(float(r[key]))
    out = {}
    for b, v in sorted(vals.items()):
        m = math.fsum(v) / len(v)
        out[(b + 1) * width] = math.fsum((x - m) ** 2 for x in v) / len(v)
    return out


def strong_curve(rows: Sequence[Row], strong: Sequence[str]) -> dict[int, float]:
    """Held-out reward@1 averaged over the strong skills, at each evaluated round (rounds done)."""
    out = {}
    for r in rows:
        vals = [float(r[f"{HELD}{s}"]) for s in strong if f"{HELD}{s}" in r]
        if vals and len(vals) == len(strong):
            out[int(r["round"]) + 1] = math.fsum(vals) / len(vals)
    return out


def edge_mean(curve: dict[int, float], first: bool, share: float = 0.2) -> float | None:
    """Mean of the first (or last) `share` of a curve's points (at least one)."""
    if not curve:
        return None
    xs = sorted(curve)
    n = max(1, round(len(xs) * share))
    pick = xs[:n] if first else xs[-n:]
    return math.fsum(curve[x] for x in pick) / len(pick)


def run_tradeoff(rows: Sequence[Row], strong: Sequence[str], warm: dict[str, float],
                 width: int) -> dict[str, Any]:
    """One run's curves and summary numbers for one policy."""
    support = binned(rows, "support_logp", width)
    kl = binned(rows, "kl_warm", width)
    gvar = windowed_variance(rows, "grad_norm", width)
    keep = strong_curve(rows, strong)
    warm_strong = (math.fsum(warm[s] for s in strong) / len(strong)
                   if strong and all(s in warm for s in strong) else None)
    if keep and warm_strong is not None:
        keep = {0: warm_strong, **keep}
    grads = [float(r["grad_norm"]) for r in rows if "grad_norm" in r]
    g_mean = math.fsum(grads) / len(grads) if grads else None
    summary: dict[str, float | None] = {
        "support_first": edge_mean(support, True),
        "support_last": edge_mean(support, False),
        "kl_warm_last": edge_mean(kl, False),
        "strong_final": keep[max(keep)] if keep else None,
        "strong_warm": warm_strong,
        "grad_norm_mean": g_mean,
        "grad_norm_var": (math.fsum((g - g_mean) ** 2 for g in grads) / len(grads)
                          if grads and g_mean is not None else None),
    }
    first, last = summary["support_first"], summary["support_last"]
    summary["support_delta"] = last - first if first is not None and last is not None else None
    sf, sw = summary["strong_final"], summary["strong_warm"]
    summary["strong_kept"] = sf - sw if sf is not None and sw is not None else None
    return {"curves": {"support_logp": support, "kl_warm": kl, "grad_norm_var": gvar,
                       "strong": keep},
            "summary": summary}


def mean_curve(curves: Sequence[dict[int, float]]) -> dict[str, list[Any]]:
    """Mean over seeds at each x present in every seed's curve."""
    curves = [c for c in curves if c]
    if not curves:
        return {"x": [], "mean": []}
    xs = sorted(set.intersection(*(set(c) for c in curves)))
    return {"x": xs, "mean": [math.fsum(c[x] for c in curves) / len(curves) for x in xs]}


def summarize_tradeoff(runs_rows: dict[str, list[dict[str, list[Row]]]],
                       policies: Sequence[str], strong: dict[str, list[str]],
                       warm: dict[str, dict[str, float]], rounds: int) -> dict[str, Any]:
    """Per arm -> policy: mean curves over seeds and summary estimates (mean, 95% CI).

    `runs_rows`: arm -> one {policy: rows} per seed."""
    width = max(1, rounds // 20)
    out: dict[str, Any] = {"bin_rounds": width, "arms": {}}
    for arm, seeds in runs_rows.items():
        per_pol: dict[str, Any] = {}
        for pol in policies:
            runs = [run_tradeoff(s[pol], strong.get(pol, []), warm.get(pol, {}), width)
                    for s in seeds if pol in s]
            if not runs:
                continue
            curves = {k: mean_curve([r["curves"][k] for r in runs])
                      for k in ("support_logp", "kl_warm", "grad_norm_var", "strong")}
            names = sorted({k for r in runs for k in r["summary"]})
            summary = {}
            for n in names:
                vals = [r["summary"][n] for r in runs if r["summary"].get(n) is not None]
                summary[n] = mean_ci(vals).as_dict() if vals else None
            per_pol[pol] = {"curves": curves, "summary": summary}
        out["arms"][arm] = per_pol
    return out
