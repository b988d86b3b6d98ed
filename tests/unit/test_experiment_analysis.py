"""From metrics rows to the experiment's numbers and tables (pure, synthetic rows)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mutualrl.experiment.analysis import (
    RunResult,
    final_and_best,
    render_markdown,
    run_diagnostics,
    summarize_regime,
    transfer_summary,
)

SKILLS = ["add", "rev"]


def _rows(evals: dict[int, dict[str, float]], rounds: int, **per_round: float) -> list[dict]:
    """metrics.jsonl-like rows: evaluations at the given rounds (0-based round index)."""
    out = []
    for k in range(rounds):
        row: dict[str, Any] = {"round": k, "policy": "x", "fallback": 0.0, **per_round}
        if k in evals:
            e = evals[k]
            row.update({f"heldout/{s}": e[s] for s in SKILLS})
            row["heldout/mean"] = sum(e[s] for s in SKILLS) / len(SKILLS)
        out.append(row)
    return out


def _run(probe: str, seed: int, a_rev: float, b_add: float, **diag: float) -> RunResult:
    # A is strong on add, B on rev; the probe changes A's rev at the end and B's add.
    rows = {
        "A": _rows({1: {"add": 0.9, "rev": 0.0}, 3: {"add": 0.9, "rev": a_rev}}, 4, **diag),
        "B": _rows({1: {"add": 0.0, "rev": 0.8}, 3: {"add": b_add, "rev": 0.8}}, 4, **diag),
    }
    see = {"policies": [{"policy_id": "A", "published": {"ROLLOUT": 10}},
                        {"policy_id": "B", "published": {"ROLLOUT": 12}}],
           "matrix": {"VERIFIED_SUCCESS": {"A": {"B": 3}}} if probe == "sgt" else {}}
    return RunResult(f"r-{probe}-{seed}", "short", probe, seed, rows, 10.0 + seed, "ok", see)


WARM = {"A": {"add": 0.9, "rev": 0.0, "mean": 0.45}, "B": {"add": 0.0, "rev": 0.8, "mean": 0.4}}


def _summary() -> dict[str, Any]:
    runs = []
    for seed in (0, 1, 2):
        runs.append(_run("none", seed, a_rev=0.0 + 0.01 * seed, b_add=0.0))
        runs.append(_run("sgt", seed, a_rev=0.6 + 0.02 * seed, b_add=0.01 * seed,
                         rescued_prompts=2.0))
    return summarize_regime(runs, ["A", "B"], WARM, ["none", "sgt"])


def test_final_and_best_take_the_last_and_the_max_evaluation() -> None:
    rows = _rows({0: {"add": 0.2, "rev": 0.9}, 2: {"add": 0.4, "rev": 0.5}}, 3)
    final, best = final_and_best(rows, SKILLS)
    assert final == {"add": 0.4, "rev": 0.5, "mean": pytest.approx(0.45)}
    assert best["add"] == 0.4 and best["rev"] == 0.9
    assert best["mean"] == pytest.approx(0.55)  # the best evaluation, not a mix of skills
    with pytest.raises(ValueError):
        final_and_best(_rows({}, 2), SKILLS)


def test_summary_pairs_seeds_against_none() -> None:
    s = _summary()
    sgt = s["probes"]["sgt"]
    # A's rev: sgt 0.60/0.62/0.64 vs none 0.00/0.01/0.02 -> +0.61 per-seed mean.
    d = sgt["policies"]["A"]["vs_none"]["rev"]
    assert d["mean"] == pytest.approx(0.61) and d["lo"] > 0
    assert sgt["policies"]["A"]["vs_warm"]["rev"]["mean"] == pytest.approx(0.62)
    both = sgt["both"]["vs_none"]
    # both = mean over policies of the per-policy skill mean.
    assert both["mean"] == pytest.approx((0.61 / 2 + 0.01 / 2) / 2)
    assert s["probes"]["none"]["both"].get("vs_none") is None
    assert sgt["policies"]["A"]["diagnostics"]["rescues_per_round"]["mean"] == 2.0
    assert sgt["wall_s"]["mean"] == pytest.approx(11.0)
    assert sgt["see"]["taken_mean"]["VERIFIED_SUCCESS"]["A"]["B"] == 3
    assert sgt["see"]["published_mean"]["B"]["ROLLOUT"] == 12
    gains = transfer_summary(s)
    assert ("A", "rev") in [(p, k) for p, k, _ in gains["sgt"]]
    # Curves start at the warm start (round 0), then rounds done (index + 1).
    c = s["curves"]["sgt"]["A"]
    assert c["rounds"] == [0, 2, 4] and c["mean"][0] == 0.45
    assert c["lo"][1] <= c["mean"][1] <= c["hi"][1]


def test_run_diagnostics_average_what_is_present() -> None:
    rows = _rows({}, 4, prp_w_mean=0.5, thl_multi_token_chunk_share=0.25)
    rows[1]["fallback"] = 1.0
    d = run_diagnostics(rows)
    assert d["rounds"] == 4 and d["fallback_rounds"] == 1
    assert d["prp_w_mean"] == 0.5 and d["thl_residual"] == 0.25
    assert "rescues_per_round" not in d


def test_markdown_has_the_tables(tmp_path: Path) -> None:
    from mutualrl.experiment.plot import plot_curves

    s = _summary()
    results = {"experiment": "t", "meta": {"seeds": [0, 1, 2], "probes": ["none", "sgt"]},
               "warm_starts": {"short": {"A": {"heldout_accuracy": WARM["A"],
                                               "strong_skills": ["add"], "flags": []},
                                         "B": {"heldout_accuracy": WARM["B"],
                                               "strong_skills": ["rev"],
                                               "flags": ["weak add starts at 0.30"]}}},
               "runs": [{"run_id": "x", "status": "failed: boom"}],
               "regimes": {"short": s}}
    md = render_markdown(results)
    assert "## Regime `short`" in md and "transfer matrix" in md
    assert "| sgt | A | rev" not in md  # per-skill rows are policy | skill
    assert "| A | rev | 0.000 |" in md
    assert "▲" in md and "weak add starts at 0.30" in md and "x: failed: boom" in md
    json.dumps(results)  # JSON-able
    png = plot_curves(results, tmp_path / "curves.png")
    assert png.stat().st_size > 10_000


def _three_policy_summary() -> dict[str, Any]:
    """A (strong add), B (strong rev), C (strong add): under sgt B learns add and A, C learn
    rev; sgt-self only half as much; every row carries the stability-support metrics."""
    def rows(final: dict[str, float], support: float, rescue: dict[str, float]) -> list[dict]:
        out = _rows({1: {"add": final["add"], "rev": final["rev"]},
                     3: {"add": final["add"], "rev": final["rev"]}}, 4)
        for k, r in enumerate(out):
            r.update(grad_norm=1.0 + k % 2, support_logp=support + 0.5 * k,
                     kl_warm=0.01 * k, **rescue)
        return out

    runs = []
    for seed in (0, 1, 2):
        e = 0.01 * seed
        for arm, gain in (("none", 0.0), ("sgt", 0.6), ("sgt-self", 0.3)):
            # (sgt-self as logged before it counted its own sources: SGT's peer texts)
            demos = {"rescue_demos/rev/B": 2.0} if arm in ("sgt", "sgt-self") else {}
            r = {"A": rows({"add": 0.9, "rev": gain + e}, -3.0, demos),
                 "B": rows({"add": gain / 2 + e, "rev": 0.8}, -4.0,
                           {"rescue_demos/add/A": 1.0} if arm == "sgt" else {}),
                 "C": rows({"add": 0.9, "rev": gain + 2 * e}, -3.0, {})}
            see = {"matrix": {"VERIFIED_SUCCESS": {"A": {"B": 6}, "B": {"A": 2, "C": 1}}}
                   if arm == "sgt" else {}}
            wall = 10.0 + seed if arm == "sgt-self" else 12.0 + 1.2 * seed  # sgt: 1.2x
            runs.append(RunResult(f"r-{arm}-{seed}", "w3", arm, seed, r, wall, "ok", see))
    warm = {p: {"add": 0.9 if p != "B" else 0.0, "rev": 0.8 if p == "B" else 0.0}
            for p in "ABC"}
    strong = {"A": ["add"], "B": ["rev"], "C": ["add"]}
    return summarize_regime(runs, ["A", "B", "C"], warm, ["none", "sgt", "sgt-self"], strong,
                            [("sgt", "sgt-self"), ("oracle", "sgt")])


def test_controls_transfer_matrix_and_tradeoff_for_three_policies(tmp_path: Path) -> None:
    from mutualrl.experiment.plot import plot_tradeoff

    s = _three_policy_summary()
    (c,) = s["contrasts"]  # oracle was not run: only sgt − sgt-self
    assert (c["a"], c["b"], c["seeds"]) == ("sgt", "sgt-self", [0, 1, 2])
    assert c["policies"]["A"]["rev"]["mean"] == pytest.approx(0.3)
    assert c["both"]["mean"] == pytest.approx((0.15 + 0.075 + 0.15) / 3)
    # sgt's wall time over sgt-self's of the same seed
    assert c["wall_ratio"]["mean"] == pytest.approx(1.2) and c["wall_ratio"]["n"] == 3
    t = s["transfer"]["sgt"]
    assert set(t) == {"A", "B", "C"} and "A" not in t["A"]
    assert t["A"]["B"]["see_taken"] == 6 and t["A"]["B"]["demos"] == {"rev": 8.0}
    assert set(t["A"]["B"]["skills"]) == {"rev"} and t["A"]["C"]["skills"] == {}
    assert t["A"]["B"]["skills"]["rev"]["vs_none"]["mean"] == pytest.approx(0.6)
    assert set(t["B"]["A"]["skills"]) == {"add"} and t["B"]["C"]["see_taken"] == 1
    assert t["C"]["B"]["skills"]["rev"]["final"]["mean"] == pytest.approx(0.62)
    assert set(s["transfer"]) == {"sgt", "sgt-self"}
    assert s["transfer"]["sgt-self"]["A"]["B"]["demos"] == {}  # trained on no peer text
    tr = s["tradeoff"]["arms"]["sgt"]["A"]
    sm = tr["summary"]
    assert sm["support_first"]["mean"] == pytest.approx(-3.0)
    assert sm["support_last"]["mean"] == pytest.approx(-1.5)
    assert sm["support_delta"]["mean"] == pytest.approx(1.5)
    assert sm["grad_norm_var"]["mean"] == pytest.approx(0.25)
    assert sm["strong_warm"]["mean"] == 0.9 and sm["strong_kept"]["mean"] == pytest.approx(0.0)
    assert tr["curves"]["strong"]["x"] == [0, 2, 4]
    results = {"experiment": "t", "meta": {}, "warm_starts": {}, "runs": [],
               "regimes": {"w3": s}}
    md = render_markdown(results)
    for text in ("| sgt − sgt-self |", "Transfer matrix under `sgt`", "Stability–support",
                 "| receiver \\ donor | A | B | C |", "all − none"):
        assert text in md, text
    row = next(line for line in md.splitlines() if line.startswith("| sgt − sgt-self |"))
    assert row.endswith("| 1.200 [1.200, 1.200] |"), row
    (png,) = plot_tradeoff(results, tmp_path)
    assert png.name == "tradeoff-w3.png" and png.stat().st_size > 20_000


def test_wall_time_against_none_and_the_published_methods_diagnostics() -> None:
    """Every arm's wall time is paired with GRPO's of the same seed; HACPO's, SAPO's and
    F-TIS's own per-round diagnostics get their table, for the arms that report them."""
    runs = []
    for seed in (0, 1, 2):
        runs.append(_run("none", seed, a_rev=0.0, b_add=0.0))
        hacpo = _run("hacpo", seed, a_rev=0.1, b_add=0.0, hacpo_s_below=0.75,
                     hacpo_log_s=-2.0, hacpo_row_weight=1.5)
        hacpo.wall_s = 2 * (10.0 + seed)  # twice GRPO's of its seed
        runs.append(hacpo)
        runs.append(_run("ftis", seed, a_rev=0.1, b_add=0.0, ftis_truncated=0.1, ftis_kl=3.0,
                         ftis_filtered=1.0))
    s = summarize_regime(runs, ["A", "B"], WARM, ["none", "hacpo", "ftis"])
    assert s["probes"]["hacpo"]["wall_vs_none"]["mean"] == pytest.approx(2.0)
    assert s["probes"]["ftis"]["wall_vs_none"]["mean"] == pytest.approx(1.0)
    assert "wall_vs_none" not in s["probes"]["none"]
    d = s["probes"]["hacpo"]["policies"]["A"]["diagnostics"]
    assert d["hacpo_s_below"]["mean"] == pytest.approx(0.75)
    md = render_markdown({"experiment": "x", "regimes": {"short": s}, "meta": {}})
    assert "| hacpo | 22 [" in md.split("### Wall time per run")[1]
    assert "2.00×" in md
    table = md.split("### HACPO, SAPO and F-TIS diagnostics")[1].split("###")[0]
    assert "| hacpo | A | 0.75 | -2 | 1.5 | — |" in table
    assert "| ftis | B | — | — | — | — | — | 0.1 | 3 | 1 |" in table
    assert "| none |" not in table


def test_an_arm_with_no_finished_run_reports_with_a_dash() -> None:
    # an interrupted grid: `sgt` ran in the regime but none of its runs finished
    runs = [_run("none", seed, a_rev=0.0, b_add=0.0) for seed in (0, 1, 2)]
    s = summarize_regime(runs, ["A", "B"], WARM, ["none", "sgt"])
    md = render_markdown({"experiment": "t", "meta": {"seeds": [0, 1, 2],
                                                      "probes": ["none", "sgt"]},
                          "warm_starts": {}, "runs": [], "regimes": {"short": s}})
    assert "## Regime `short`" in md
    assert any(line.startswith("| sgt | A | — | —") for line in md.splitlines()), md


def test_peer_data_that_carries_gradient_gets_its_table() -> None:
    """The share of live peer groups and of peer rows with gradient per row class, averaged
    per round then over seeds, for the arms that train on peer rows only."""
    runs = []
    for seed in (0, 1, 2):
        runs.append(_run("none", seed, a_rev=0.0, b_add=0.0))
        runs.append(_run("sapo", seed, a_rev=0.1, b_add=0.0, peer_groups_live=0.125,
                         peer_rows_rescue=4.0, peer_grad_share_rescue=0.0,
                         peer_rows_other=12.0, peer_grad_share_other=0.5 + 0.1 * seed))
    s = summarize_regime(runs, ["A", "B"], WARM, ["none", "sapo"])
    d = s["probes"]["sapo"]["policies"]["B"]["diagnostics"]
    assert d["peer_grad_share_other"]["mean"] == pytest.approx(0.6)
    md = render_markdown({"experiment": "x", "regimes": {"short": s}, "meta": {}})
    table = md.split("### Peer data that carries gradient")[1].split("###")[0]
    assert "| sapo | A | 0.125 | 4 | 0 | 12 | 0.6 |" in table
    assert "| none |" not in table
