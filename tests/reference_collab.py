"""HACPO, SAPO and F-TIS by their definitions (docs/design.md (12)-(14)), in plain Python on
lists of floats: the reference the trainer's `algos.hacpo`, `algos.sapo`, `algos.ftis` and
`algos.methods` are tested against. Written from the papers' equations and the HACPO authors'
recipe, not from the implementation: no torch, no trainer import, loops instead of tensors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

EPS = 1e-6


def clip(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def pstd(xs: Sequence[float]) -> float:
    """Population std (ddof 0)."""
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


# HACPO ---------------------------------------------------------------------------------------

def capability(per_round_means: Sequence[float], window: int) -> float:
    """P: the mean of a policy's last `window` per-round mean rewards (1 with none), each
    floored at 1e-8."""
    last = [max(x, 1e-8) for x in per_round_means][-window:]
    return max(mean(last), 1e-8) if last else 1.0


def hacpo_advantages(own: Sequence[float], peers: Sequence[tuple[float, float]],
                     cap: float | None = 1.0, scale: str = "group",
                     round_own: Sequence[float] | None = None
                     ) -> tuple[list[float], list[float]]:
    """One prompt: own rewards and (reward, baseline weight) of each peer response. The
    baseline is the weighted mean over everything (own weights 1), the plain mean when all
    rewards are equal, the own mean when the weighted one exceeds `cap`; the scale is the
    plain std of everything (group), of the round's own rewards (batch) or none."""
    rewards = list(own) + [r for r, _ in peers]
    weights = [1.0] * len(own) + [w for _, w in peers]
    if all(r == rewards[0] for r in rewards):
        mu = mean(rewards)
    else:
        mu = sum(w * r for w, r in zip(weights, rewards, strict=True)) / len(rewards)
        if cap is not None and mu > cap:
            mu = mean(own)
    if scale == "group":
        adv = [(r - mu) / (pstd(rewards) + EPS) for r in rewards]
    elif scale == "batch":
        adv = [(r - mu) / (pstd(round_own or own) + EPS) for r in rewards]
    else:
        adv = [r - mu for r in rewards]
    return adv[: len(own)], adv[len(own):]


def hacpo_lower(delta: float, step: float, update: int) -> float:
    return min(1.0, 1.0 - delta + update * step)


def hacpo_peer_row(logp: Sequence[float], sender_mean: float, adv: float, weight: float,
                   lower: float, alpha: float = 1.0, max_log: float = 10.0
                   ) -> tuple[float, list[float]]:
    """A peer row's per-token loss value (the same on each of its tokens) and the derivative
    of that value with respect to each of the row's token log-probs.

    s = exp(clamp(mean(logp) − sender_mean, ±max_log)); value = −c · c₀^α · w · A with
    c = clip(s, lower, 1) and c₀ its value held constant. Inside [lower, 1] (and inside the
    log clamp) dc/dlogp_t = s / n; outside, the clip (or the clamp) is flat."""
    n = len(logp)
    raw = mean(logp) - sender_mean
    log_s = clip(raw, -max_log, max_log)
    s = math.exp(log_s)
    c = clip(s, lower, 1.0)
    value = -c * c ** alpha * weight * adv
    inside = lower <= s <= 1.0 and -max_log <= raw <= max_log
    dc = s / n if inside else 0.0
    return value, [-dc * c ** alpha * weight * adv] * n


# SAPO and F-TIS ------------------------------------------------------------------------------

def group_advantages(rewards: Sequence[float]) -> list[float]:
    """GRPO within one group: (r − mean) / (std + ε), ddof 0."""
    m, sd = mean(rewards), pstd(rewards)
    return [(r - m) / (sd + EPS) for r in rewards]


def per_source(rows: Sequence[tuple[str, float]]) -> list[float]:
    """Advantages of one prompt's peer rows (source, reward), each within its source's group."""
    by_source: dict[str, list[int]] = {}
    for j, (src, _) in enumerate(rows):
        by_source.setdefault(src, []).append(j)
    out = [0.0] * len(rows)
    for idx in by_source.values():
        for j, a in zip(idx, group_advantages([rows[j][1] for j in idx]), strict=True):
            out[j] = a
    return out


def ftis_chunks(recv_chunk_logp: Sequence[float], send_chunk_logp: Sequence[float],
                cap: float) -> tuple[list[float], float]:
    """Per chunk: min(exp(recv − send), C); and KL̂ = Σ (r log r − r + 1), r = exp(recv − send)."""
    weights, kl = [], 0.0
    for a, b in zip(recv_chunk_logp, send_chunk_logp, strict=True):
        r = math.exp(a - b)
        weights.append(min(r, cap))
        kl += r * math.log(r) - r + 1.0
    return weights, kl


def ftis_kept(adv: float, kl: float, gate: float) -> bool:
    """A sample stays unless its advantage is negative and its KL̂ exceeds the gate."""
    return not (adv < 0 and kl > gate)
