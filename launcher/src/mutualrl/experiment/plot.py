"""curves.png: held-out reward@1 vs round, one panel per (regime, policy), one line per probe with
its 95% band over seeds (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLORS = {"none": "#444444", "prp": "#1f77b4", "xgrpo": "#2ca02c", "sgt": "#d62728"}


def plot_curves(results: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = list(results["regimes"].items())
    n_cols = max(len(reg["policies"]) for _, reg in regimes) + 1
    fig, axes = plt.subplots(len(regimes), n_cols, figsize=(4.2 * n_cols, 3.4 * len(regimes)),
                             squeeze=False, sharey=True)
    for i, (regime, reg) in enumerate(regimes):
        cols = [*reg["policies"], "both"]
        for j in range(n_cols):
            ax = axes[i][j]
            if j >= len(cols):
                ax.axis("off")
                continue
            name = cols[j]
            for probe, per_pol in reg["curves"].items():
                c = _both_curve(per_pol, reg["policies"]) if name == "both" else per_pol.get(name)
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
