"""curves.png: held-out reward@1 vs round, one panel per (regime, policy), one line per probe with
its 95% band over seeds; tradeoff-<regime>.png: the stability-support picture, one column per
probe (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mutualrl.experiment.analysis import mean_label

COLORS = {"none": "#444444", "prp": "#1f77b4", "xgrpo": "#2ca02c", "sgt": "#d62728",
          "sgt-self": "#ff7f0e", "oracle": "#9467bd", "prp-seq": "#17becf",
          "prp-chunk": "#1f77b4"}
POLICY_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")


def plot_curves(results: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = list(results["regimes"].items())
    n_cols = max(len(reg["policies"]) for _, reg in regimes) + 1
    fig, axes = plt.subplots(len(regimes), n_cols, figsize=(4.2 * n_cols, 3.4 * len(regimes)),
                             squeeze=False, sharey=True)
    for i, (regime, reg) in enumerate(regimes):
        mean_col = mean_label(reg["policies"])
        cols = [*reg["policies"], mean_col]
        for j in range(n_cols):
            ax = axes[i][j]
            if j >= len(cols):
                ax.axis("off")
                continue
            name = cols[j]
            for probe, per_pol in reg["curves"].items():
                c = (_both_curve(per_pol, reg["policies"]) if name == mean_col
                     else per_pol.get(name))
                if not c or not c["rounds"]:
                    continue
                color = COLORS.get(probe)
                ax.plot(c["rounds"], c["mean"], label=probe, color=color, lw=1.6)
                if "lo" in c:
                    ax.fill_between(c["rounds"], c["lo"], c["hi"], color=color, alpha=0.18,
                                    lw=0)
            ax.set_title(f"{regime}: {name}", fontsize=10)
            ax.set_xlabel("round")
            if j == 0:
                ax.set_ylabel("held-out reward@1 (mean over skills)")
            ax.set_ylim(0, 1)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"{results['experiment']}: lines = mean over seeds, bands = 95% CI",
                 fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _both_curve(per_pol: dict[str, Any], policies: list[str]) -> dict[str, Any] | None:
    """The both-policy average of the per-policy mean curves (rounds common to all)."""
    found = [per_pol.get(p) for p in policies]
    curves = [c for c in found if c is not None]
    if len(curves) != len(found):
        return None
    common = sorted(set.intersection(*(set(c["rounds"]) for c in curves)))
    idx = [{r: k for k, r in enumerate(c["rounds"])} for c in curves]
    mean = [sum(c["mean"][ix[r]] for c, ix in zip(curves, idx, strict=True)) / len(curves)
            for r in common]
    return {"rounds": common, "mean": mean}


TRADEOFF_ROWS = (
    ("reward", "held-out reward@1\n(mean over skills)"),
    ("support_logp", "support: log-prob of peer\nsuccesses on failed prompts"),
    ("kl_warm", "KL to warm start\n(per token)"),
    ("strong", "strong skills kept\n(held-out reward@1)"),
    ("grad_norm_var", "grad-norm variance\n(per window)"),
)


def plot_tradeoff(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """One figure per regime: columns = probes, rows = reward, support and the three stability
    measures, one line per policy (mean over seeds). Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for regime, reg in results["regimes"].items():
        arms = (reg.get("tradeoff") or {}).get("arms") or {}
        if not arms:
            continue
        names = list(arms)
        fig, axes = plt.subplots(len(TRADEOFF_ROWS), len(names),
                                 figsize=(max(3.3 * len(names), 6.5), 2.3 * len(TRADEOFF_ROWS)),
                                 squeeze=False, sharex=True, sharey="row")
        for j, arm in enumerate(names):
            for i, (key, label) in enumerate(TRADEOFF_ROWS):
                ax = axes[i][j]
                for k, pol in enumerate(reg["policies"]):
                    color = POLICY_COLORS[k % len(POLICY_COLORS)]
                    if key == "reward":
                        c = reg["curves"].get(arm, {}).get(pol)
                        xs, ys = (c["rounds"], c["mean"]) if c else ([], [])
                    else:
                        c = arms[arm].get(pol, {}).get("curves", {}).get(key) or {}
                        xs, ys = c.get("x", []), c.get("mean", [])
                    if xs:
                        ax.plot(xs, ys, color=color, lw=1.4, label=pol)
                if key == "grad_norm_var":
                    ax.set_yscale("symlog", linthresh=1e-2)
                if i == 0:
                    ax.set_title(arm, fontsize=10)
                if j == 0:
                    ax.set_ylabel(label, fontsize=8)
                if i == len(TRADEOFF_ROWS) - 1:
                    ax.set_xlabel("round")
                ax.grid(alpha=0.3)
                ax.tick_params(labelsize=7)
        axes[0][0].legend(fontsize=7, loc="best")
        fig.suptitle(f"{results['experiment']} / {regime}: stability–support per probe\n"
                     "(lines = policies, mean over seeds)", fontsize=10)
        fig.tight_layout()
        path = out_dir / f"tradeoff-{regime}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
