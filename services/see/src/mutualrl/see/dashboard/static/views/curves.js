// Live curves per policy: train reward, pass rate, rescued prompts per round, held-out reward
// (mean and per skill), benchmarks (avg@n, pass@k), the optimisation figures, then MWRA's
// compute (threads, rollout workers, rollout / update overlap). One line per policy in every panel.

import { ema, LinePanel } from "../charts.js";
import { clear, h } from "../dom.js";
import { COMPUTE, ComputeTable } from "./compute.js";

const MAIN = [
  { metric: "reward_mean", title: "Train reward", subtitle: "mean over the round's G × prompts", smooth: true, yRange: [0, 1] },
  { metric: "pass_rate", title: "Pass rate", subtitle: "share of verified samples", smooth: true, yRange: [0, 1] },
  { metric: "rescued_prompts", title: "Rescued prompts / round", subtitle: "SGT: failed prompts a peer's verified success rescued", smooth: true, yRange: [0, 1],
    absent: "reported by the sgt probe only: this run's trainers use another probe" },
  { metric: "heldout/mean", title: "Held-out reward · mean", subtitle: "greedy reward@1 over every skill", markers: true, yRange: [0, 1],
    absent: "no evaluation yet (trainers evaluate every eval.every rounds)" },
];
const MORE = [
  { metric: "loss", title: "Loss", smooth: true },
  { metric: "grad_norm", title: "Gradient norm (before clip)", smooth: true },
  { metric: "kl", title: "KL to reference", smooth: true, absent: "no reference model (grpo.beta = 0)" },
  { metric: "clip_frac", title: "Clipped ratio share", smooth: true },
  { metric: "tokens_per_s", title: "Tokens / s", smooth: true },
  { metric: "step_s", title: "Round time (s)", smooth: true },
];

export function curvesView(root, { policies, live }) {
  let alpha = Number(sessionStorage.getItem("mutualrl.smoothing") || "0");
  const panels = new Map();
  const mainGrid = h("div", { class: "grid four" });
  const skillGrid = h("div", { class: "grid four" });
  const moreGrid = h("div", { class: "grid small" });
  const benchGrid = h("div", { class: "grid four" });
  const computeGrid = h("div", { class: "grid small", style: { marginTop: "14px" } });
  const plan = new ComputeTable(policies);
  const select = h("select", { id: "smoothing", "aria-label": "smoothing" },
    [["0", "off"], ["0.6", "0.6"], ["0.8", "0.8"], ["0.95", "0.95"]].map(([v, l]) =>
      h("option", { value: v, selected: Number(v) === alpha }, l)));
  select.addEventListener("change", () => {
    alpha = Number(select.value);
    sessionStorage.setItem("mutualrl.smoothing", select.value);
    render();
  });
  clear(root,
    h("div", { class: "toolbar" }, h("label", {}, "Smoothing (EMA) ", select),
      h("span", { class: "muted" }, "Drag across a chart to zoom into rounds, double-click to reset. Held-out points are the trainers' periodic evaluations.")),
    mainGrid,
    h("h2", { class: "section" }, "Held-out reward per skill"), skillGrid,
    h("h2", { class: "section" }, "Benchmarks"), benchGrid,
    h("h2", { class: "section" }, "Optimisation"), moreGrid,
    h("h2", { class: "section", id: "compute" }, "Compute (MWRA): threads, rollout workers, rollout ‖ update"),
    plan.el, computeGrid);

  function panel(spec, grid) {
    if (!panels.has(spec.metric)) {
      const p = new LinePanel({ ...spec, policies, height: grid === moreGrid || grid === computeGrid ? 150 : 190 });
      p.smooth = !!spec.smooth;
      panels.set(spec.metric, p);
      grid.append(p.el);
    }
    return panels.get(spec.metric);
  }

  MAIN.forEach((s) => panel(s, mainGrid));
  MORE.forEach((s) => panel(s, moreGrid));
  COMPUTE.forEach((s) => panel(s, computeGrid));
  const skillNote = h("p", { class: "muted" }, "No held-out evaluation reported yet (trainers evaluate every eval.every rounds).");
  skillGrid.append(skillNote);
  const benchNote = h("p", { class: "muted" }, "No benchmark reported yet (eval.benchmarks, every eval.every rounds).");
  benchGrid.append(benchNote);

  function render() {
    const skills = live.keysWith("heldout/").filter((s) => s !== "mean");
    skillNote.hidden = skills.length > 0;
    for (const s of skills) panel({ metric: `heldout/${s}`, title: `Held-out · ${s}`, markers: true, yRange: [0, 1] }, skillGrid);
    // bench/<name>/avg@n and pass@k (per skill: bench/<name>/<skill>/...), one panel each.
    const bench = live.keysWith("bench/").filter((k) => k.includes("@"));
    benchNote.hidden = bench.length > 0;
    for (const k of bench) panel({ metric: `bench/${k}`, title: `Benchmark · ${k.split("/").join(" · ")}`, markers: true, yRange: [0, 1] }, benchGrid);
    const anyRows = live.maxRound() !== null;
    plan.update(live);
    for (const p of panels.values()) {
      p.update(policies.map((pol) => {
        const pts = live.series(pol, p.metric);
        return p.smooth ? ema(pts, alpha) : pts;
      }), anyRows);
    }
  }

  render();
  const unsub = live.subscribe((changed) => { if (changed) render(); });
  return { destroy() { unsub(); for (const p of panels.values()) p.destroy(); } };
}
