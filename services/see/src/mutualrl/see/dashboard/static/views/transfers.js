// Transfer matrix: for each record kind, how many records each policy (row, taker) took from
// each other policy (column, source), over a chosen window of rounds. Refreshes every 3 s.

import { enc, getPages } from "../api.js";
import { colorOf } from "../charts.js";
import { RoundWindow } from "../controls.js";
import { clear, fmt, h } from "../dom.js";

const KINDS = [
  { kind: "VERIFIED_SUCCESS", title: "Verified successes", note: "SGT learns from these" },
  { kind: "REWARD_STATS", title: "Reward statistics", note: "XGRPO pools these; SGT and PRP gate on them" },
  { kind: "ROLLOUT", title: "Rollouts", note: "PRP pools these" },
];

export function transfersView(root, { runId, policies, live }) {
  let stopped = false;
  let timer = null;
  const win = new RoundWindow("", live, () => load());
  const caption = h("p", { class: "muted", id: "window-caption" });
  const grid = h("div", { class: "heat-grid" });
  const error = h("p", { class: "error", role: "alert" });
  error.hidden = true;

  clear(root,
    h("div", { class: "toolbar" }, win.el,
      h("span", { class: "muted" }, "Rows take from columns. Counted when SEE hands a record over, under the round of the record taken.")),
    caption, error, grid);

  function heatmap(spec, matrix) {
    const m = matrix[spec.kind] || {};
    let max = 0;
    for (const t of policies) for (const s of policies) if (t !== s) max = Math.max(max, (m[t] || {})[s] || 0);
    const colTotals = Object.fromEntries(policies.map((s) => [s, policies.reduce((a, t) => a + (t === s ? 0 : (m[t] || {})[s] || 0), 0)]));
    const head = h("tr", {}, h("th", { class: "corner" }, "taker ↓  source →"),
      policies.map((s) => h("th", { class: "col" }, h("i", { class: "dot", style: { background: colorOf(policies, s) } }), s)),
      h("th", { class: "total" }, "taken"));
    const rows = policies.map((t) => {
      let rowTotal = 0;
      const cells = policies.map((s) => {
        if (s === t) return h("td", { class: "self", title: "a policy never takes its own records" }, "·");
        const n = (m[t] || {})[s] || 0;
        rowTotal += n;
        const f = max ? n / max : 0;
        return h("td", {
          class: "cell", dataset: { kind: spec.kind, taker: t, source: s, count: n },
          style: { background: `rgba(37, 99, 235, ${(0.06 + 0.84 * f).toFixed(3)})`, color: f > 0.55 ? "#fff" : "#1f2937" },
          title: `${t} took ${n.toLocaleString("en-US")} ${spec.kind} records of ${s}`,
        }, fmt(n));
      });
      return h("tr", {}, h("th", { class: "row" }, h("i", { class: "dot", style: { background: colorOf(policies, t) } }), t),
        cells, h("td", { class: "total" }, fmt(rowTotal)));
    });
    const foot = h("tr", { class: "foot" }, h("th", { class: "row" }, "given"),
      policies.map((s) => h("td", { class: "total" }, fmt(colTotals[s]))), h("td"));
    return h("section", { class: "panel heat", dataset: { kind: spec.kind } },
      h("header", {}, h("h3", {}, spec.title), h("span", { class: "sub" }, spec.note)),
      h("table", { class: "heatmap" }, h("thead", {}, head), h("tbody", {}, rows, foot)));
  }

  async function load() {
    clearTimeout(timer);
    const [a, b] = win.get();
    try {
      let r = null;
      await getPages(`/v1/runs/${enc(runId)}/transfers`, { round_min: a, round_max: b }, (page) => {
        if (r === null) { r = page; return; }
        for (const [kind, takers] of Object.entries(page.matrix))
          for (const [taker, sources] of Object.entries(takers))
            Object.assign(((r.matrix[kind] ??= {})[taker] ??= {}), sources);
      });
      if (stopped) return;
      error.hidden = true;
      const span = r.first_round === null ? "no record taken yet" : `records of rounds ${r.first_round}–${r.last_round} were taken so far`;
      caption.textContent = a === null && b === null
        ? `All rounds (run totals, as GetRunStats reports them); ${span}.`
        : `Rounds ${a ?? 0} to ${b ?? "the last"}; ${span}.`;
      grid.dataset.window = `${a ?? ""}:${b ?? ""}`;
      clear(grid, KINDS.map((k) => heatmap(k, r.matrix)));
      grid.dataset.loaded = String(Date.now());
    } catch (e) {
      error.textContent = e.message;
      error.hidden = false;
    }
    if (!stopped) timer = setTimeout(load, 3000);
  }

  load();
  return { destroy() { stopped = true; clearTimeout(timer); } };
}
