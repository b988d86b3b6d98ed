"""From per-round metrics of every run to the experiment's numbers: final and best held-out
reward@1 per skill with 95% CIs over seeds, paired differences against `none`, per-skill
transfer (gain vs the warm start and vs `none`), probe diagnostics, and curves.

Pure: takes plain dicts (parsed metrics.jsonl rows, sft_eval.json, SEE stats), returns plain
dicts; `render_markdown` turns the result into the tables of results.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mutualrl.experiment.config import CONTROL
from mutualrl.experiment.stats import Estimate, mean_ci, paired_difference
from mutualrl.experiment.tradeoff import summarize_tradeoff

Row = dict[str, Any]
HELD = "heldout/"


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A Markdown table's lines: the header, the rule, one line per row of cells.

    Written here rather than taken from a table library: the cells are already formatted
    strings, and a Markdown table is three string joins."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows)]

# Per-round diagnostics averaged over a run (key in metrics.jsonl -> name in results).
DIAGNOSTICS: dict[str, str] = {
    "rescued_prompts": "rescues_per_round",
    "baseline_shift": "baseline_shift",
    "peer_samples": "peer_samples_per_round",
    "prp_w_mean": "prp_w_mean",
    "prp_w_var": "prp_w_var",
    "prp_w_mean_log": "prp_w_mean_log",
    "prp_w_kept": "prp_w_kept",
    "prp_w_clipped": "prp_w_clipped",
    "thl_multi_token_chunk_share": "thl_residual",
    "step_s": "step_s",
    "rescue_demos": "rescue_demos_per_round",
    "loss_sgt": "loss_sgt",
    "sgt_self_missing": "sgt_self_missing",
    "support_logp": "support_logp",
    "kl_warm": "kl_warm",
    "grad_norm": "grad_norm",
    "hacpo_s_below": "hacpo_s_below",
    "hacpo_log_s": "hacpo_log_s",
    "hacpo_row_weight": "hacpo_row_weight",
    "sapo_groups": "sapo_groups",
    "sapo_groups_dropped": "sapo_groups_dropped",
    "ftis_truncated": "ftis_truncated",
    "ftis_kl": "ftis_kl",
    "ftis_filtered": "ftis_filtered",
    "peer_groups_live": "peer_groups_live",
    "peer_rows_rescue": "peer_rows_rescue",
    "peer_grad_share_rescue": "peer_grad_share_rescue",
    "peer_rows_other": "peer_rows_other",
    "peer_grad_share_other": "peer_grad_share_other",
}
COLLAB = ("hacpo_s_below", "hacpo_log_s", "hacpo_row_weight", "sapo_groups",
          "sapo_groups_dropped", "ftis_truncated", "ftis_kl", "ftis_filtered")
"""The published collaborative methods' diagnostics (HACPO, SAPO, F-TIS)."""
GRADIENT = ("peer_groups_live", "peer_rows_rescue", "peer_grad_share_rescue",
            "peer_rows_other", "peer_grad_share_other")
"""Which peer data carries a learning signal, for every arm that trains on peer rows: the
share of (prompt, peer) groups with a non-zero advantage, and per row class (a verified
success on a prompt the learner failed / every other row) the rows per update and the share
of them whose policy-gradient term has a non-zero gradient."""


@dataclass
class RunResult:
    """What one finished run left behind."""

    run_id: str
    regime: str
    probe: str
    seed: int
    rows: dict[str, list[Row]]
    """policy -> metrics.jsonl rows in round order."""
    wall_s: float
    status: str = "ok"
    see: dict[str, Any] = field(default_factory=dict)
    """SEE's /v1/runs/{run}/stats answer (published per kind, transfer matrix)."""


def eval_rows(rows: Sequence[Row]) -> list[Row]:
    """The rows that carry a held-out evaluation."""
    return [r for r in rows if f"{HELD}mean" in r]


def skill_names(rows: Sequence[Row]) -> list[str]:
    evs = eval_rows(rows)
    if not evs:
        return []
    return [k[len(HELD):] for k in evs[-1] if k.startswith(HELD) and k != f"{HELD}mean"]


def final_and_best(rows: Sequence[Row], skills: Sequence[str]) -> tuple[dict[str, float],
                                                                       dict[str, float]]:
    """Held-out reward@1 per skill and "mean": at the last evaluation, and the best over
    evaluations (per key: the best mean is the best evaluation, not a mix of skills)."""
    evs = eval_rows(rows)
    if not evs:
        raise ValueError("no evaluated round")
    keys = [*skills, "mean"]
    final = {k: float(evs[-1][f"{HELD}{k}"]) for k in keys}
    best = {k: max(float(r[f"{HELD}{k}"]) for r in evs) for k in keys}
    return final, best


def run_diagnostics(rows: Sequence[Row]) -> dict[str, float]:
    """Per-run averages of the probe diagnostics present, rounds trained and fallback rounds."""
    out: dict[str, float] = {"rounds": float(len(rows)),
                             "fallback_rounds": float(sum(r.get("fallback", 0.0) for r in rows))}
    for key, name in DIAGNOSTICS.items():
        vals = [float(r[key]) for r in rows if key in r]
        if vals:
            out[name] = math.fsum(vals) / len(vals)
    return out


def est(values: Sequence[float]) -> dict[str, float] | None:
    return mean_ci(list(values)).as_dict() if values else None


def diff(treated: Sequence[float], control: Sequence[float]) -> dict[str, float] | None:
    if not treated or len(treated) != len(control):
        return None
    return paired_difference(list(treated), list(control)).as_dict()


def _by_seed(runs: Sequence[RunResult]) -> dict[int, RunResult]:
    return {r.seed: r for r in runs if r.status == "ok"}


def summarize_regime(runs: Sequence[RunResult], policies: Sequence[str],
                     warm: dict[str, dict[str, float]], probes: Sequence[str],
                     strong: dict[str, list[str]] | None = None,
                     contrasts: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """One regime's numbers. Differences against `none` pair seeds present under both;
    `contrasts` (a, b) add paired a − b; `strong` (policy -> warm-started skills) gives the
    transfer matrix and the stability side of the trade-off."""
    strong = strong or {}
    by_probe = {p: _by_seed([r for r in runs if r.probe == p]) for p in probes}
    skills: list[str] = []
    for rs in by_probe.values():
        for r in rs.values():
            skills = skill_names(r.rows[policies[0]])
            if skills:
                break
        if skills:
            break
    # per probe -> seed -> policy -> (final, best)
    fb: dict[str, dict[int, dict[str, tuple[dict[str, float], dict[str, float]]]]] = {}
    for p, rs in by_probe.items():
        fb[p] = {s: {pol: final_and_best(r.rows[pol], skills) for pol in policies}
                 for s, r in rs.items()}
    control = fb.get(CONTROL, {})
    out: dict[str, Any] = {"skills": skills, "policies": list(policies), "probes": {},
                           "warm_start": warm}
    for p in probes:
        seeds = sorted(fb[p])
        paired = [s for s in seeds if s in control]
        entry: dict[str, Any] = {"seeds": seeds, "policies": {}}
        for pol in policies:
            pe: dict[str, Any] = {"final": {}, "best": {}, "vs_none": {}, "vs_none_best": {},
                                  "vs_warm": {}}
            for k in [*skills, "mean"]:
                fin = [fb[p][s][pol][0][k] for s in seeds]
                bst = [fb[p][s][pol][1][k] for s in seeds]
                pe["final"][k] = est(fin)
                pe["best"][k] = est(bst)
                if k in warm.get(pol, {}):
                    pe["vs_warm"][k] = est([v - warm[pol][k] for v in fin])
                if p != CONTROL:
                    pe["vs_none"][k] = diff([fb[p][s][pol][0][k] for s in paired],
                                            [control[s][pol][0][k] for s in paired])
                    pe["vs_none_best"][k] = diff([fb[p][s][pol][1][k] for s in paired],
                                                 [control[s][pol][1][k] for s in paired])
            diags = [run_diagnostics(by_probe[p][s].rows[pol]) for s in seeds]
            names = sorted({n for d in diags for n in d})
            pe["diagnostics"] = {n: est([d[n] for d in diags if n in d]) for n in names}
            entry["policies"][pol] = pe

        def both(seed_map: dict[str, tuple[dict[str, float], dict[str, float]]],
                 which: int) -> float:
            return math.fsum(seed_map[pol][which]["mean"] for pol in policies) / len(policies)

        entry["both"] = {
            "final": est([both(fb[p][s], 0) for s in seeds]),
            "best": est([_best_both(by_probe[p][s], policies) for s in seeds]),
        }
        if p != CONTROL:
            entry["both"]["vs_none"] = diff([both(fb[p][s], 0) for s in paired],
                                            [both(control[s], 0) for s in paired])
            entry["both"]["vs_none_best"] = diff(
                [_best_both(by_probe[p][s], policies) for s in paired],
                [_best_both(by_probe[CONTROL][s], policies) for s in paired])
        entry["wall_s"] = est([by_probe[p][s].wall_s for s in seeds])
        if p != CONTROL:  # a run's wall time against GRPO's of the same seed
            entry["wall_vs_none"] = est([by_probe[p][s].wall_s / by_probe[CONTROL][s].wall_s
                                         for s in paired if by_probe[CONTROL][s].wall_s > 0])
        entry["see"] = see_summary([by_probe[p][s].see for s in seeds], policies)
        out["probes"][p] = entry
    out["curves"] = curves(by_probe, policies, warm)
    walls = {p: {s: r.wall_s for s, r in rs.items()} for p, rs in by_probe.items()}
    out["contrasts"] = [c for a, b in contrasts if a in fb and b in fb and fb[a] and fb[b]
                        for c in [contrast(fb, a, b, policies, skills, walls)]]
    if strong:
        out["strong"] = {p: list(strong.get(p, [])) for p in policies}
        out["transfer"] = {arm: transfer_matrix(by_probe, fb, arm, policies, skills, strong)
                           for arm in probes if arm in ("sgt", "oracle", "sgt-self")
                           and by_probe.get(arm)}
    rounds = max((len(r.rows[pol]) for rs in by_probe.values() for r in rs.values()
                  for pol in policies), default=1)
    out["tradeoff"] = summarize_tradeoff(
        {p: [r.rows for r in rs.values()] for p, rs in by_probe.items() if rs}, policies,
        strong, warm, rounds)
    return out


FB = dict[str, dict[int, dict[str, tuple[dict[str, float], dict[str, float]]]]]


def contrast(fb: FB, a: str, b: str, policies: Sequence[str], skills: Sequence[str],
             walls: dict[str, dict[int, float]] | None = None) -> dict[str, Any]:
    """Paired final reward@1 differences a − b: over all policies, per policy, per skill;
    with `walls` (arm -> seed -> a run's wall seconds) also a's wall time over b's."""
    seeds = sorted(set(fb[a]) & set(fb[b]))

    def final(arm: str, s: int, pol: str, k: str) -> float:
        return fb[arm][s][pol][0][k]

    def allpol(arm: str, s: int) -> float:
        return math.fsum(final(arm, s, p, "mean") for p in policies) / len(policies)

    return {
        "a": a, "b": b, "seeds": seeds,
        "both": diff([allpol(a, s) for s in seeds], [allpol(b, s) for s in seeds]),
        "policies": {pol: {k: diff([final(a, s, pol, k) for s in seeds],
                                   [final(b, s, pol, k) for s in seeds])
                           for k in [*skills, "mean"]} for pol in policies},
        "wall_ratio": est([walls[a][s] / walls[b][s] for s in seeds if walls[b][s] > 0])
        if walls else None,
    }


def mean_label(policies: Sequence[str]) -> str:
    """What the tables and plots call the mean over a regime's policies."""
    return "both" if len(policies) == 2 else "all"


def transfer_matrix(by_probe: dict[str, dict[int, RunResult]], fb: FB, arm: str,
                    policies: Sequence[str], skills: Sequence[str],
                    strong: dict[str, list[str]]) -> dict[str, Any]:
    """Who learned what from whom under `arm`: per (receiver, donor) the VERIFIED_SUCCESS
    records the receiver took from the donor (SEE), the demonstrations per skill it trained on
    (trainer metrics `rescue_demos/<skill>/<donor>`), both per run (mean over seeds), and the
    receiver's held-out gain against `none` (paired) and against its warm start on every skill
    the donor was warm-started on and the receiver was not."""
    runs = by_probe[arm]
    control = fb.get(CONTROL, {})
    cells: dict[str, dict[str, Any]] = {}
    for r in policies:
        cells[r] = {}
        for d in policies:
            if d == r:
                continue
            taken = [float(((run.see.get("matrix") or {}).get("VERIFIED_SUCCESS") or {})
                           .get(r, {}).get(d, 0.0)) for run in runs.values() if run.see]
            demos: dict[str, float] = {}
            # The controls train on no peer text: sgt-self on its own successes, the oracle on
            # reference answers. (Their older runs logged, under the peers' names, the peer
            # texts SGT would have used; so their cells count no demonstrations.)
            for run in runs.values() if arm not in ("sgt-self", "oracle") else ():
                for row in run.rows[r]:
                    for key, v in row.items():
                        if key.startswith("rescue_demos/") and key.endswith(f"/{d}"):
                            sk = key.split("/")[1]
                            demos[sk] = demos.get(sk, 0.0) + float(v) / len(runs)
            gains = {}
            for sk in skills:
                if sk in strong.get(d, []) and sk not in strong.get(r, []):
                    seeds = sorted(set(fb[arm]) & set(control))
                    gains[sk] = {
                        "final": est([fb[arm][s][r][0][sk] for s in sorted(fb[arm])]),
                        "vs_none": diff([fb[arm][s][r][0][sk] for s in seeds],
                                        [control[s][r][0][sk] for s in seeds]),
                    }
            cells[r][d] = {"see_taken": math.fsum(taken) / len(taken) if taken else None,
                           "demos": demos, "skills": gains}
    return cells


def _best_both(run: RunResult, policies: Sequence[str]) -> float:
    """Best over evaluation rounds of the both-policy average (evaluated at the same rounds)."""
    per = [{int(r["round"]): float(r[f"{HELD}mean"]) for r in eval_rows(run.rows[pol])}
           for pol in policies]
    common = set.intersection(*(set(d) for d in per))
    return max(math.fsum(d[k] for d in per) / len(per) for k in common)


def see_summary(stats: Sequence[dict[str, Any]], policies: Sequence[str]) -> dict[str, Any]:
    """Mean over seeds of records published per policy and kind, and taken per kind/taker/source."""
    stats = [s for s in stats if s]
    if not stats:
        return {}
    published: dict[str, dict[str, float]] = {}
    for s in stats:
        for p in s.get("policies", []):
            for kind, n in (p.get("published") or {}).items():
                published.setdefault(p["policy_id"], {}).setdefault(kind, 0.0)
                published[p["policy_id"]][kind] += n / len(stats)
    taken: dict[str, dict[str, dict[str, float]]] = {}
    for s in stats:
        for kind, takers in (s.get("matrix") or {}).items():
            for taker, sources in takers.items():
                for source, n in sources.items():
                    slot = taken.setdefault(kind, {}).setdefault(taker, {})
                    slot[source] = slot.get(source, 0.0) + n / len(stats)
    return {"published_mean": published, "taken_mean": taken, "runs": len(stats)}


def curves(by_probe: dict[str, dict[int, RunResult]], policies: Sequence[str],
           warm: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Held-out mean reward@1 vs rounds done, per probe and policy: mean and 95% CI over seeds
    at each evaluated round (round 0 is the warm start)."""
    out: dict[str, Any] = {}
    for p, rs in by_probe.items():
        out[p] = {}
        for pol in policies:
            per_round: dict[int, list[float]] = {}
            for r in rs.values():
                for row in eval_rows(r.rows[pol]):
                    per_round.setdefault(int(row["round"]) + 1, []).append(
                        float(row[f"{HELD}mean"]))
            xs = sorted(per_round)
            ests = [mean_ci(per_round[x]) for x in xs]
            if pol in warm and "mean" in warm[pol]:
                w = warm[pol]["mean"]
                xs, ests = [0, *xs], [Estimate(w, w, w, 1, 0.0), *ests]
            out[p][pol] = {"rounds": xs, "mean": [e.mean for e in ests],
                           "lo": [e.lo for e in ests], "hi": [e.hi for e in ests],
                           "n": [e.n for e in ests]}
    return out


# ---- markdown --------------------------------------------------------------------------------


def fmt(e: dict[str, float] | None, signed: bool = False) -> str:
    if not e:
        return "—"
    return Estimate(e["mean"], e["lo"], e["hi"], int(e["n"]), e["std"]).fmt(signed=signed)


def _excl(e: dict[str, float] | None) -> bool:
    return bool(e) and e is not None and e["n"] > 1 and (e["lo"] > 0 or e["hi"] < 0)


def _mark(e: dict[str, float] | None) -> str:
    """A difference whose CI excludes 0 is marked (▲ gain, ▼ loss)."""
    if e is None or not _excl(e):
        return ""
    return " ▲" if e["mean"] > 0 else " ▼"


def render_markdown(results: dict[str, Any]) -> str:
    lines: list[str] = [f"# {results['experiment']}: probe comparison", ""]
    meta = results.get("meta", {})
    lines.append(f"Seeds {meta.get('seeds')}, probes {meta.get('probes')}; "
                 f"wall time {meta.get('wall', '?')}. Held-out reward@1 (greedy) with "
                 "95% t-intervals over seeds; differences are paired by seed against `none`; "
                 "▲/▼ mark differences whose interval excludes 0.")
    if results.get("quick"):
        lines.append("")
        lines.append("**Quick mode**: a reduced grid for tests; the numbers mean nothing.")
    lines.append("")
    for regime, reg in results["regimes"].items():
        lines += _regime_markdown(regime, reg, results)
    failed = [r for r in results.get("runs", []) if r.get("status") != "ok"]
    if failed:
        lines += ["## Failed runs", ""]
        lines += [f"- {r['run_id']}: {r.get('status')}" for r in failed]
        lines.append("")
    return "\n".join(lines) + "\n"


def _regime_markdown(regime: str, reg: dict[str, Any], results: dict[str, Any]) -> list[str]:
    pols, skills, probes = reg["policies"], reg["skills"], list(reg["probes"])
    warm = reg.get("warm_start", {})
    out = [f"## Regime `{regime}`", ""]
    ws = results.get("warm_starts", {}).get(regime, {})
    if ws:
        rows = []
        for pol in pols:
            info = ws.get(pol, {})
            acc = info.get("heldout_accuracy", {})
            strong = set(info.get("strong_skills", []))
            cells = [f"{acc.get(s, float('nan')):.3f}{'*' if s in strong else ''}"
                     for s in skills]
            flags = "; ".join(info.get("flags", [])) or "ok"
            rows.append([pol, *cells, f"{acc.get('mean', 0):.3f}", flags])
        out += ["### Warm start (held-out accuracy before RL)", "",
                *md_table(["policy", *skills, "mean", "flags"], rows)]
        out += ["", "`*` strong (warm-started) skill; the others are weak and should start near "
                "0.", ""]
    allp = mean_label(pols)
    rows = []
    for p in probes:
        e = reg["probes"][p]
        b = e["both"]
        rows.append([p, *(fmt(e["policies"][pol]["final"]["mean"]) for pol in pols),
                     fmt(b["final"]), f"{fmt(b.get('vs_none'), True)}{_mark(b.get('vs_none'))}",
                     fmt(b["best"]),
                     f"{fmt(b.get('vs_none_best'), True)}{_mark(b.get('vs_none_best'))}"])
    out += ["### Final held-out reward@1 (mean over skills)", "",
            *md_table(["probe", *pols, allp, f"{allp} − none", f"best {allp}", "best − none"],
                      rows), ""]
    rows = []
    for p in probes:
        e = reg["probes"][p]
        wall, ratio = e.get("wall_s"), e.get("wall_vs_none")
        rows.append([p, "—" if not wall else
                     f"{wall['mean']:.0f} [{wall['lo']:.0f}, {wall['hi']:.0f}]",
                     "—" if not ratio else format(ratio["mean"], ".2f") + "×"])
    out += ["### Wall time per run (paired by seed)", "",
            *md_table(["probe", "wall s", "× none"], rows), ""]
    out += ["### Per-skill transfer matrix (final reward@1; gain vs warm start; gain vs none)",
            "", "Rows: policy and skill (`*` strong at warm start). Each cell: final, "
            "(Δ warm start), [Δ none, paired].", ""]
    rows = []
    for pol in pols:
        strong = set(results.get("warm_starts", {}).get(regime, {}).get(pol, {})
                     .get("strong_skills", []))
        for s in skills:
            w = warm.get(pol, {}).get(s)
            cells = []
            for p in probes:
                pe = reg["probes"][p]["policies"][pol]
                fin, vw, vn = pe["final"].get(s), pe["vs_warm"].get(s), pe["vs_none"].get(s)
                cell = f"{fin['mean']:.3f}" if fin else "—"
                if vw:
                    cell += f" ({vw['mean']:+.2f})"
                if p != CONTROL and vn:
                    cell += f" [{vn['mean']:+.2f}{_mark(vn).strip()}]"
                cells.append(cell)
            wtxt = f"{w:.3f}" if w is not None else "—"
            rows.append([pol, f"{s}{'*' if s in strong else ''}", wtxt, *cells])
    out += [*md_table(["policy", "skill", "warm", *probes], rows), ""]
    gains = transfer_summary(reg)
    if gains:
        out += ["Gains whose paired CI vs `none` excludes 0 (probe: policy skill Δ):", ""]
        out += [f"- {p}: " + (", ".join(f"{pol} {s} {d:+.2f}" for pol, s, d in g) or "none")
                for p, g in gains.items()]
        out.append("")
    rows = []
    for p in probes:
        for pol in pols:
            pe = reg["probes"][p]["policies"][pol]
            vs = pe["vs_none"].get("mean")
            rows.append([p, pol, fmt(pe["final"]["mean"]), f"{fmt(vs, True)}{_mark(vs)}",
                         fmt(pe["best"]["mean"]), fmt(pe["vs_none_best"].get("mean"), True)])
    out += ["### Per-policy final reward@1 with 95% CI, and the difference to none", "",
            *md_table(["probe", "policy", "final", "Δ none", "best", "Δ none (best)"], rows),
            ""]
    out += contrasts_markdown(reg)
    out += transfer_markdown(reg)
    out += tradeoff_markdown(reg)
    rows = []
    for p in probes:
        e = reg["probes"][p]
        for pol in pols:
            d = e["policies"][pol]["diagnostics"]

            def g(name: str, digits: int = 3, d: dict[str, Any] = d) -> str:
                v = d.get(name)
                return "—" if not v else f"{v['mean']:.{digits}g}"

            wall = e.get("wall_s")  # None: no run of the arm finished (an interrupted grid)
            rows.append([p, pol, g("rounds", 4), "—" if not wall else f"{wall['mean']:.0f}",
                         g("fallback_rounds"), g("rescues_per_round"), g("baseline_shift"),
                         g("peer_samples_per_round"), g("prp_w_mean"), g("prp_w_var"),
                         g("prp_w_kept"), g("prp_w_clipped"), g("thl_residual")])
    out += ["### Probe diagnostics (per-round means, averaged over seeds)", "",
            *md_table(["probe", "policy", "rounds", "wall s", "fallback rounds",
                       "rescues/round", "baseline shift", "peer samples/round", "PRP w mean",
                       "PRP w var", "PRP kept", "PRP clipped", "THL residual"], rows), ""]
    out += collab_markdown(reg, probes, pols)
    out += gradient_markdown(reg, probes, pols)
    rows = []
    for p in probes:
        see = reg["probes"][p].get("see") or {}
        pub = "; ".join(
            f"{pol}: " + " / ".join(f"{v.get(k, 0):.0f}" for k in
                                    ("ROLLOUT", "REWARD_STATS", "VERIFIED_SUCCESS"))
            for pol, v in (see.get("published_mean") or {}).items())
        tk = "; ".join(f"{kind}: " + ", ".join(f"{t}←{s} {n:.0f}" for t, ss in takers.items()
                                               for s, n in ss.items())
                       for kind, takers in (see.get("taken_mean") or {}).items()) or "none"
        rows.append([p, pub or "—", tk])
    out += ["### Records through SEE (mean per run): published per policy, taken per kind", "",
            *md_table(["probe", "published (policy: ROLLOUT / REWARD_STATS / VERIFIED_SUCCESS)",
                       "taken (kind: taker←source n)"], rows), ""]
    return out


def diagnostic_rows(reg: dict[str, Any], probes: Sequence[str], pols: Sequence[str],
                    names: Sequence[str]) -> list[list[str]]:
    """[probe, policy, the seed mean of each of `names`] for the arms and policies that report
    any of them ("—" for one not reported)."""
    rows: list[list[str]] = []
    for p in probes:
        for pol in pols:
            d = reg["probes"][p]["policies"][pol]["diagnostics"]
            if any(n in d for n in names):
                rows.append([p, pol, *("—" if d.get(n) is None else f"{d[n]['mean']:.3g}"
                                       for n in names)])
    return rows


def collab_markdown(reg: dict[str, Any], probes: Sequence[str], pols: Sequence[str]
                    ) -> list[str]:
    """The published methods' own diagnostics (per-round means, averaged over seeds), for the
    arms that report them: HACPO's share of peer ratios below the clip band, mean log ratio and
    row weight; SAPO's peer groups taken and dropped; F-TIS's truncated chunks, KL estimate
    and filtered rows."""
    rows = diagnostic_rows(reg, probes, pols, COLLAB)
    if not rows:
        return []
    return ["### HACPO, SAPO and F-TIS diagnostics (per-round means, averaged over seeds)", "",
            *md_table(["probe", "policy", "HACPO s < l₀", "HACPO log s", "HACPO row w",
                       "SAPO groups", "SAPO dropped", "F-TIS truncated", "F-TIS KL",
                       "F-TIS filtered"], rows), ""]


def gradient_markdown(reg: dict[str, Any], probes: Sequence[str], pols: Sequence[str]
                      ) -> list[str]:
    """`GRADIENT` per arm and policy (per-round means, averaged over seeds), for the arms that
    train on peer rows."""
    rows = diagnostic_rows(reg, probes, pols, GRADIENT)
    if not rows:
        return []
    return ["### Peer data that carries gradient (per-round means, averaged over seeds)", "",
            "Rescue rows: verified peer successes on prompts the learner failed; other: every "
            "other peer row. A row carries gradient when its policy-gradient term's gradient "
            "in its log-probs is non-zero (counted per update).", "",
            *md_table(["probe", "policy", "peer groups with A ≠ 0", "rescue rows/update",
                       "rescue rows with gradient", "other rows/update",
                       "other rows with gradient"], rows), ""]


def transfer_summary(reg: dict[str, Any]) -> dict[str, list[tuple[str, str, float]]]:
    """Per probe: (policy, skill, mean gain) where the paired difference to `none` excludes 0
    and is positive."""
    out: dict[str, list[tuple[str, str, float]]] = {}
    for p, e in reg["probes"].items():
        if p == CONTROL:
            continue
        out[p] = [(pol, s, e["policies"][pol]["vs_none"][s]["mean"])
                  for pol in reg["policies"] for s in reg["skills"]
                  if _excl(e["policies"][pol]["vs_none"].get(s))
                  and e["policies"][pol]["vs_none"][s]["mean"] > 0]
    return out


def contrasts_markdown(reg: dict[str, Any]) -> list[str]:
    """SGT against its controls (and any configured contrast): paired a − b."""
    cs = reg.get("contrasts") or []
    if not cs:
        return []
    pols = reg["policies"]
    allp = mean_label(pols)
    out = ["### Controls: paired differences of final held-out reward@1", "",
           "SGT − sgt-self: what peer information adds over the same amount of own supervision; "
           "oracle − SGT: what a perfect peer would add over the real ones. Wall a / b: a "
           "run's wall time over b's of the same seed.", ""]
    rows = [[f"{c['a']} − {c['b']}", f"{fmt(c['both'], True)}{_mark(c['both'])}",
             *(f"{fmt(c['policies'][p]['mean'], True)}{_mark(c['policies'][p]['mean'])}"
               for p in pols), fmt(c.get("wall_ratio"))] for c in cs]
    return [*out, *md_table(["contrast", allp, *pols, "wall a / b"], rows), ""]


def transfer_markdown(reg: dict[str, Any]) -> list[str]:
    """The receiver x donor matrix of each SGT-family arm."""
    out: list[str] = []
    pols = reg["policies"]
    for arm, cells in (reg.get("transfer") or {}).items():
        out += [f"### Transfer matrix under `{arm}`: who learned what from whom", "",
                "Rows: receiver; columns: donor. Each cell: VERIFIED_SUCCESS records the "
                "receiver took from the donor through SEE (mean per run); demonstrations it "
                "trained on per skill; and for each skill the donor was warm-started on and "
                "the receiver was not: final held-out reward@1 [paired Δ vs none].", ""]
        rows = []
        for r in pols:
            row = []
            for d in pols:
                c = cells.get(r, {}).get(d)
                if c is None:
                    row.append("—")
                    continue
                parts = [f"{c['see_taken']:.0f} taken" if c["see_taken"] is not None else "—"]
                if c["demos"]:
                    parts.append("demos " + ", ".join(f"{k} {v:.0f}"
                                                      for k, v in sorted(c["demos"].items())))
                for sk, g in c["skills"].items():
                    fin, vn = g.get("final"), g.get("vs_none")
                    parts.append(f"**{sk}** {fin['mean']:.2f}" if fin else f"**{sk}** —")
                    if vn:
                        parts[-1] += f" [{vn['mean']:+.2f}{_mark(vn).strip()}]"
                row.append("; ".join(parts))
            rows.append([r, *row])
        out += [*md_table(["receiver \\ donor", *pols], rows), ""]
    return out


def tradeoff_markdown(reg: dict[str, Any]) -> list[str]:
    """Support and stability per arm and policy (means over seeds)."""
    t = reg.get("tradeoff") or {}
    arms = t.get("arms") or {}
    if not arms:
        return []
    out = ["### Stability–support (per arm and policy; mean over seeds)", "",
           "Support: mean per-token log-prob of peers' verified successes on prompts the "
           "policy failed, first → last fifth of the run. Stability: KL to the warm start "
           "(last fifth), strong skills' held-out reward@1 warm → final, gradient-norm mean "
           "and variance over the run.", ""]
    rows = []
    for arm, per_pol in arms.items():
        for pol, e in per_pol.items():
            sm = e["summary"]

            def v(name: str, spec: str = ".3f", sm: dict[str, Any] = sm) -> str:
                x = sm.get(name)
                return "—" if not x else format(x["mean"], spec)

            fin = reg["probes"].get(arm, {}).get("policies", {}).get(pol, {}).get("final", {})
            rows.append([arm, pol, f"{v('support_first', '.2f')} → {v('support_last', '.2f')}",
                         v("support_delta", "+.2f"), v("kl_warm_last", ".3g"),
                         f"{v('strong_warm', '.2f')} → {v('strong_final', '.2f')}",
                         v("grad_norm_mean", ".3g"), v("grad_norm_var", ".3g"),
                         fmt(fin.get("mean"))])
    out += [*md_table(["probe", "policy", "support first → last", "Δ support", "KL to warm",
                       "strong warm → final", "grad-norm mean", "grad-norm var",
                       "final reward"], rows), ""]
    return out
