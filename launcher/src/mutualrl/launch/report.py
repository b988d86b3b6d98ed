"""What `mutualrl up` shows: a live status table per policy while it runs, then a results table,
a reward-curve plot and SEE's transfer matrix when the trainers finish."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from rich.table import Table

from mutualrl.client.rest import follow_pages
from mutualrl.launch.plan import LaunchPlan


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Every complete JSON line of a metrics file (a line being written is skipped)."""
    rows = []
    try:
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        pass
    return rows


def _last_with(rows: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    for row in reversed(rows):
        if any(k.startswith(prefix) for k in row):
            return dict(row)
    return {}


def status_table(plan: LaunchPlan, done: set[str]) -> Table:
    table = Table(title=f"mutualrl up - run {plan.run_id}", expand=False)
    for col in ("policy", "round", "reward", "pass", "held-out", "rescued", "step s", "state"):
        table.add_column(col, justify="left" if col in ("policy", "state") else "right")
    for name in plan.policies:
        rows = read_rows(plan.metrics_files[name])
        last = rows[-1] if rows else {}
        held = _last_with(rows, "heldout/").get("heldout/mean")
        if held is None:  # a table task reports benchmarks: the first one's overall avg@n
            bench = _last_with(rows, "bench/")
            held = next((v for k, v in sorted(bench.items())
                         if k.startswith("bench/") and k.count("/") == 2 and "/avg@" in k), None)
        rescued = sum(r.get("rescued_prompts", 0.0) for r in rows)
        state = "done" if f"trainer-{name}" in done else ("training" if rows else "starting")
        table.add_row(name, f"{last.get('round', '-')}/{plan.rounds}",
                      f"{last.get('reward_mean', 0.0):.3f}" if last else "-",
                      f"{last.get('pass_rate', 0.0):.2f}" if last else "-",
                      f"{held:.3f}" if held is not None else "-",
                      f"{rescued:.0f}", f"{last.get('step_s', 0.0):.2f}" if last else "-", state)
    return table


def _warm_start_accuracy(plan: LaunchPlan, policy: str) -> dict[str, float] | None:
    """Held-out accuracy `mutualrl sft` measured for the policy's warm start, if it has one."""
    import yaml

    cfg = yaml.safe_load(plan.config_path.read_text())
    for p in cfg["trainer"]["policies"]:
        if p["name"] == policy and p.get("sft_checkpoint"):
            path = Path(p["sft_checkpoint"]) / "sft_eval.json"
            if path.exists():
                return dict(json.loads(path.read_text())["heldout_accuracy"])
    return None


def results(plan: LaunchPlan, stats: dict[str, Any] | None = None) -> dict[str, Any]:
    """Per policy: held-out reward@1 per skill at the start (the warm start's SFT evaluation, or
    the first RL evaluation) and at the end, rounds, rescues, mean step time, and what crossed:
    records published to SEE and records taken from peers (SEE's `stats`; None when SEE did not
    answer), and the rounds whose publish failed."""
    out: dict[str, Any] = {}
    shared = {p["policy_id"]: p for p in (stats or {}).get("policies", [])}
    for name in plan.policies:
        rows = read_rows(plan.metrics_files[name])
        evals = [r for r in rows if any(k.startswith("heldout/") for k in r)]
        final = evals[-1] if evals else {}
        skills = sorted(k.split("/", 1)[1] for k in final if k.startswith("heldout/"))
        warm = _warm_start_accuracy(plan, name)
        before = _before(rows)
        if warm is not None:
            start, start_label = warm, "warm start"
        elif any(k.startswith("heldout/") for k in before):
            start = {k.split("/", 1)[1]: float(v) for k, v in before.items()
                     if k.startswith("heldout/")}
            start_label = "before round 0"
        else:
            first = evals[0] if evals else {}
            start = {s: float(first[f"heldout/{s}"]) for s in skills if f"heldout/{s}" in first}
            start_label = f"round {first.get('round')}"
        out[name] = {
            "rounds": rows[-1]["round"] + 1 if rows else 0,
            "start_label": start_label,
            "heldout_start": {s: start.get(s) for s in skills},
            "heldout_final": {s: final.get(f"heldout/{s}") for s in skills},
            "rescued_prompts": sum(r.get("rescued_prompts", 0.0) for r in rows),
            "mean_step_s": sum(r.get("step_s", 0.0) for r in rows) / max(1, len(rows)),
            "demos_by_donor": demos_by_donor(rows),
            "benchmarks": benchmarks(rows),
            "sharing": sharing(rows),
            "records_published": shared[name]["total"] if name in shared else None,
            "records_taken": shared[name]["taken"] if name in shared else None,
            "publish_failed_rounds": sum(int(r.get("publish_failed", 0.0) > 0) for r in rows),
            "compute": compute(rows),
        }
    return out


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in rows if key in r]
    return sum(values) / len(values) if values else None


def compute(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What MWRA gave the policy and how it spent it: threads in the first and last round and
    their range (they move when a peer waits for this policy or finishes), rollout workers and
    their threads in the last round, and the mean seconds per round of rollouts, update and the
    whole round. None without rounds."""
    if not rows:
        return None
    threads = [int(r["threads"]) for r in rows if "threads" in r]
    last = rows[-1]
    return {
        "threads_first": threads[0] if threads else None,
        "threads_last": threads[-1] if threads else None,
        "threads_min": min(threads, default=None),
        "threads_max": max(threads, default=None),
        "rollout_workers": int(last.get("rollout_workers", 0)),
        "rollout_threads": int(last.get("rollout_threads", 0)),
        # sampling time: with a rollout worker `rollout_s` is only the learner's wait for it
        "mean_rollout_s": _mean(rows, "generate_s" if "generate_s" in last else "rollout_s"),
        "mean_update_s": _mean(rows, "update_s"),
        "mean_step_s": _mean(rows, "step_s"),
    }


def _threads(c: dict[str, Any]) -> str:
    lo, hi, last = c["threads_min"], c["threads_max"], c["threads_last"]
    if last is None:
        return "-"
    return str(last) if lo == hi else f"{last} ({lo}-{hi})"


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


COMPUTE_HEAD = ("policy", "threads: last (range)", "rollout workers", "rollout threads",
                "rollout s", "update s", "round s")


def _compute_cells(c: dict[str, Any]) -> list[str]:
    return [_threads(c), str(c["rollout_workers"]), str(c["rollout_threads"]),
            _secs(c["mean_rollout_s"]), _secs(c["mean_update_s"]), _secs(c["mean_step_s"])]


def compute_table(res: dict[str, Any]) -> Table | None:
    """MWRA's plan as the policies lived it (`compute`); None when no policy ran a round."""
    rows = [(name, r["compute"]) for name, r in res.items() if r.get("compute")]
    if not rows:
        return None
    table = Table(title="compute per policy (MWRA): threads, rollout workers, seconds per round")
    for i, col in enumerate(COMPUTE_HEAD):
        table.add_column(col, justify="left" if i == 0 else "right")
    for name, c in rows:
        table.add_row(name, *_compute_cells(c))
    return table


def _before(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The evaluation before the first update (`start/<metric>` of round 0's row), without
    its prefix."""
    for r in rows:
        if r.get("round") == 0:
            return {k.split("/", 1)[1]: v for k, v in r.items() if k.startswith("start/")}
    return {}


def sharing(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Rounds whose probe read peer data (metric `shared`: not a fall-back to plain GRPO; in
    the deterministic mode, not one of the first `staleness` rounds); None when the policy's
    probe reads no peers."""
    flags = [float(r["shared"]) for r in rows if "shared" in r]
    if not flags:
        return None
    return {"rounds": len(flags), "shared": sum(flags), "fraction": sum(flags) / len(flags),
            "lead_wait_s": sum(r.get("lead_wait_s", 0.0) for r in rows)}


def benchmarks(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per benchmark (`bench/<name>/...` metrics): its final figures (avg@n, pass@k, and per
    skill under `skills`) and its curve, one point per evaluation at rounds done."""
    out: dict[str, dict[str, Any]] = {}
    for key, v in _before(rows).items():  # the evaluation before round 0: 0 rounds done
        if key.startswith("bench/"):
            _, name, rest = key.split("/", 2)
            b = out.setdefault(name, {"final": {}, "skills": {}, "curve": [], "start": {}})
            b.setdefault("start", {})[rest] = v
            if not b["curve"]:
                b["curve"].append({"round": 0})
            b["curve"][0][rest] = v
    for r in rows:
        for key, v in r.items():
            if not key.startswith("bench/"):
                continue
            _, name, rest = key.split("/", 2)
            b = out.setdefault(name, {"final": {}, "skills": {}, "curve": [], "start": {}})
            if not b["curve"] or b["curve"][-1]["round"] != r["round"] + 1:
                b["curve"].append({"round": r["round"] + 1})
            b["curve"][-1][rest] = v
            if "/" in rest:
                skill, metric = rest.split("/", 1)
                b["skills"].setdefault(skill, {})[metric] = v
            else:
                b["final"][rest] = v
    return out


def demos_by_donor(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """donor -> skill -> demonstrations trained on (`rescue_demos/<skill>/<donor>`; the donor is
    a peer under SGT, the policy itself under sgt-self and `reference` under the oracle)."""
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        for key, v in r.items():
            if key.startswith("rescue_demos/"):
                _, skill, donor = key.split("/", 2)
                out.setdefault(donor, {})[skill] = out.get(donor, {}).get(skill, 0.0) + v
    return out


def learned_table(res: dict[str, Any]) -> Table | None:
    """Who learned what from whom: demonstrations per receiver, donor and skill, with the
    receiver's start -> final held-out reward@1 on that skill."""
    table = Table(title="NLL demonstrations: receiver <- donor, per skill (start → final)")
    for col in ("receiver", "donor", "skill", "demos", "held-out"):
        table.add_column(col, justify="right" if col in ("demos", "held-out") else "left")
    rows = 0
    for name, r in res.items():
        for donor, skills in sorted(r.get("demos_by_donor", {}).items()):
            for skill, n in sorted(skills.items(), key=lambda kv: -kv[1]):
                a, b = r["heldout_start"].get(skill), r["heldout_final"].get(skill)
                held = f"{a:.2f}→{b:.2f}" if a is not None and b is not None else "-"
                table.add_row(name, donor, skill, f"{n:.0f}", held)
                rows += 1
    return table if rows else None


def _cells(r: dict[str, Any], skills: list[str]) -> list[str]:
    cells = []
    for s in [*skills, "mean"]:
        a, b = r["heldout_start"].get(s), r["heldout_final"].get(s)
        cells.append("-" if b is None else f"{a:.2f}→{b:.2f}" if a is not None else f"{b:.2f}")
    return cells


def _skills(res: dict[str, Any]) -> list[str]:
    return sorted({s for r in res.values() for s in r["heldout_final"] if s != "mean"})


def results_table(res: dict[str, Any]) -> Table:
    skills = _skills(res)
    table = Table(title="held-out reward@1 per skill: start → final")
    table.add_column("policy")
    for s in [*skills, "mean"]:
        table.add_column(s, justify="right")
    for col in ("rescued", "published", "taken", "failed publishes"):
        table.add_column(col, justify="right")
    for name, r in res.items():
        table.add_row(name, *_cells(r, skills), f"{r['rescued_prompts']:.0f}",
                      *(_count(r.get(k)) for k in ("records_published", "records_taken",
                                                   "publish_failed_rounds")))
    return table


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def results_markdown(res: dict[str, Any]) -> str:
    skills = _skills(res)
    head = ["policy", *skills, "mean", "rescued prompts", "records published",
            "records taken", "failed publishes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in res.items():
        shared = " | ".join(_count(r.get(k)) for k in ("records_published", "records_taken",
                                                       "publish_failed_rounds"))
        lines.append(f"| {name} | " + " | ".join(_cells(r, skills))
                     + f" | {r['rescued_prompts']:.0f} | {shared} |")
    bench = [(name, b, metric, figs.get("start", {}).get(metric), v)
             for name, r in res.items() for b, figs in r.get("benchmarks", {}).items()
             for metric, v in figs["final"].items() if "@" in metric]
    if bench:
        lines += ["", "| policy | benchmark | metric | start | final |", "|---|---|---|---|---|"]
        lines += [f"| {n} | {b} | {m} | {_num(a)} | {v:.3f} |" for n, b, m, a, v in bench]
    spent = [(name, r["compute"]) for name, r in res.items() if r.get("compute")]
    if spent:
        lines += ["", "| " + " | ".join(COMPUTE_HEAD) + " |", "|" + "---|" * len(COMPUTE_HEAD)]
        lines += [f"| {n} | " + " | ".join(_compute_cells(c)) + " |" for n, c in spent]
    counts = benchmark_problems(res)
    if counts:
        lines += ["", "| benchmark | problems scored | dropped (longer than a policy's limit) |",
                  "|---|---|---|"]
        lines += [f"| {b} | {n:.0f} | {d:.0f} |" for b, (n, d) in counts.items()]
    reads = [(name, r["sharing"]) for name, r in res.items() if r.get("sharing")]
    if reads:
        lines += ["", "| policy | rounds that read peer data | fraction |", "|---|---|---|"]
        lines += [f"| {n} | {x['shared']:.0f} of {x['rounds']} | {x['fraction']:.2f} |"
                  for n, x in reads]
    return "\n".join(lines)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def nothing_shared(res: dict[str, Any]) -> str | None:
    """A run of two or more policies asked to share fails when a policy's probe read peer data
    in none of its rounds (every round fell back to plain GRPO): the reason, else None."""
    if len(res) < 2:
        return None
    alone = [name for name, r in res.items() if r.get("sharing") and not r["sharing"]["shared"]]
    if not alone:
        return None
    return (f"{', '.join(alone)} read no peer data in any round: every round fell back to "
            "plain GRPO, nothing was shared (docs/determinism.md)")


def sharing_table(res: dict[str, Any]) -> Table | None:
    """Per policy: the rounds whose probe read peer data, of the rounds it trained, and the
    seconds spent keeping within `exchange.max_lead_rounds` of the slowest peer."""
    rows = [(name, r["sharing"]) for name, r in res.items() if r.get("sharing")]
    if not rows:
        return None
    table = Table(title="sharing: rounds that read peer data (not a fall-back to GRPO)")
    for col in ("policy", "shared", "fraction", "lead wait s"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, x in rows:
        table.add_row(name, f"{x['shared']:.0f}/{x['rounds']}", f"{x['fraction']:.2f}",
                      f"{x['lead_wait_s']:.1f}")
    return table


def benchmark_problems(res: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Per benchmark: (problems scored, problems dropped as longer than some policy's limit),
    the same for every policy (a problem one policy cannot take is dropped for all)."""
    out: dict[str, tuple[float, float]] = {}
    for r in res.values():
        for b, figs in r.get("benchmarks", {}).items():
            final = figs["final"]
            if "problems" in final:
                out.setdefault(b, (final["problems"], final.get("dropped_overlong", 0.0)))
    return out


def benchmark_table(res: dict[str, Any]) -> Table | None:
    """Every benchmark's final avg@n and pass@k per policy."""
    rows = [(name, b, figs["final"]) for name, r in res.items()
            for b, figs in r.get("benchmarks", {}).items()]
    if not rows:
        return None
    metrics = sorted({m for _, _, f in rows for m in f if "@" in m},
                     key=lambda m: (m.split("@")[0] != "avg", int(m.split("@")[1])))
    table = Table(title="benchmarks: start → final (before round 0 → the last evaluation)",
                  caption="; ".join(f"{b}: {n:.0f} problems scored, {d:.0f} dropped as longer "
                                    "than a policy's limit"
                                    for b, (n, d) in benchmark_problems(res).items()) or None)
    for col in ("policy", "benchmark", *metrics):
        table.add_column(col, justify="left" if col in ("policy", "benchmark") else "right")
    for name, b, f in rows:
        start = res[name]["benchmarks"][b].get("start", {})
        table.add_row(name, b, *("-" if m not in f else f"{f[m]:.3f}" if m not in start
                                 else f"{start[m]:.3f}→{f[m]:.3f}" for m in metrics))
    return table


def plot_curves(plan: LaunchPlan, path: Path) -> None:
    """One panel per policy: held-out reward@1 per skill (markers) and train reward (faint),
    against rounds done; round 0 is the warm start (its own evaluation) when there is one, else
    the evaluation before the first update."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(plan.policies), figsize=(6 * len(plan.policies), 4.2),
                             dpi=110, sharey=True, squeeze=False)
    for ax, name in zip(axes[0], plan.policies, strict=True):
        rows = read_rows(plan.metrics_files[name])
        ax.plot([r["round"] + 1 for r in rows], [r.get("reward_mean", 0.0) for r in rows],
                color="grey", alpha=0.4, linewidth=1, label="train reward")
        evals = [{**r, "round": r["round"] + 1} for r in rows if "heldout/mean" in r]
        warm = _warm_start_accuracy(plan, name)
        before = {k: v for k, v in _before(rows).items() if k.startswith("heldout/")}
        if warm is not None:
            evals.insert(0, {"round": 0, **{f"heldout/{k}": v for k, v in warm.items()}})
        elif before:
            evals.insert(0, {"round": 0, **before})
        keys = sorted({k for r in evals for k in r if k.startswith("heldout/")})
        for bench, figs in benchmarks(rows).items():  # the overall figures, dotted
            for metric in sorted(m for m in figs["final"] if "@" in m):
                pts = [(c["round"], c[metric]) for c in figs["curve"] if metric in c]
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="s", markersize=3,
                        linestyle=":", label=f"{bench} {metric}")
        for key in keys:
            style = {"linestyle": "--", "color": "black"} if key == "heldout/mean" else {}
            pts = [(r["round"], r[key]) for r in evals if key in r]
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o",
                    markersize=3, label=key.split("/", 1)[1], **style)
        ax.set_title(name)
        ax.set_xlabel("rounds done (0 = warm start)" if warm is not None else "rounds done")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    axes[0][0].set_ylabel("held-out reward@1")
    fig.suptitle(f"run {plan.run_id}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def see_stats(plan: LaunchPlan) -> dict[str, Any] | None:
    """SEE's per-run statistics through its REST API (None when it does not answer)."""
    import os

    url = f"{plan.endpoints['see_rest']}/v1/runs/{plan.run_id}/stats"
    token = plan.secret or os.environ.get("MUTUALRL_AUTH_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    def page(cursor: str | None) -> dict[str, Any]:
        query = f"?{urllib.parse.urlencode({'cursor': cursor})}" if cursor else ""
        with urllib.request.urlopen(urllib.request.Request(url + query, headers=headers),
                                    timeout=5) as reply:
            return dict(json.loads(reply.read()))

    try:
        return follow_pages(page)
    except OSError:
        return None


def transfer_table(stats: dict[str, Any]) -> Table:
    table = Table(title="SEE transfer matrix: records of source taken by taker")
    for col in ("kind", "taker", "source", "records"):
        table.add_column(col, justify="right" if col == "records" else "left")
    for kind, takers in sorted(stats.get("matrix", {}).items()):
        for taker, sources in sorted(takers.items()):
            for source, count in sorted(sources.items()):
                table.add_row(kind, taker, source, str(count))
    return table


def final_report(plan: LaunchPlan, console: Any, failure: str | None = None) -> dict[str, Any]:
    """The results (console, results.json, results.md, the plot); `failure`: what ended a run
    that failed, reported with what it had done by then."""
    stats = see_stats(plan)
    res = results(plan, stats)
    console.print(results_table(res))
    bench = benchmark_table(res)
    if bench is not None:
        console.print(bench)
    plot = plan.run_dir / "curves.png"
    plot_curves(plan, plot)
    spent = compute_table(res)
    if spent is not None:
        console.print(spent)
    learned = learned_table(res)
    if learned is not None:
        console.print(learned)
    shared = sharing_table(res)
    if shared is not None:
        console.print(shared)
    failure = failure or nothing_shared(res)
    if stats is not None:
        console.print(transfer_table(stats))
    summary = {"run_id": plan.run_id, "status": "failed" if failure else "finished",
               "failure": failure, "results": res, "see_stats": stats, "plot": str(plot)}
    (plan.run_dir / "results.json").write_text(json.dumps(summary, indent=2))
    (plan.run_dir / "results.md").write_text(results_markdown(res) + "\n")
    console.print(f"plot: {plot}\nresults: {plan.run_dir / 'results.json'}")
    if not plan.up.serve_after:
        console.print("(set `up: {serve_after: true}` to keep SEE's REST API up after training)")
    return summary
