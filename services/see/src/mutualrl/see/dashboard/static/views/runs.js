// Every run on this SEE, newest first, with its policies and how much each has published.

import { get, getPages, enc } from "../api.js";
import { colorOf } from "../charts.js";
import { ago, clear, fmt, h } from "../dom.js";

export function runsPage(app, crumbs) {
  let stopped = false;
  let timer = null;
  clear(crumbs, h("span", {}, "Runs"));
  const body = h("tbody");
  const table = h("table", { class: "runs", id: "runs" },
    h("thead", {}, h("tr", {}, ["Run", "Policies", "Records stored", "Taken from peers", "τ", "Created"].map((c) => h("th", {}, c)))),
    body);
  const note = h("p", { class: "muted" });
  clear(app, h("div", { class: "page" },
    h("div", { class: "page-head" }, h("h1", {}, "Runs"),
      h("p", { class: "muted" }, "Every run this Shared Experience Exchange holds. Pick one to watch it train.")),
    h("div", { class: "card flush" }, table), note));

  async function load() {
    try {
      const runs = [];
      await getPages("/v1/runs", { limit: 1000 }, (page) => runs.push(...page.runs));
      runs.sort((a, b) => b.created_unix_ms - a.created_unix_ms);
      const stats = await Promise.all(runs.slice(0, 50).map((r) =>
        get(`/v1/runs/${enc(r.run_id)}/policies`).catch(() => null)));
      if (stopped) return;
      clear(body, runs.map((r, i) => {
        const st = stats[i];
        const total = st ? st.policies.reduce((a, p) => a + p.total, 0) : null;
        const taken = st ? st.policies.reduce((a, p) => a + p.taken, 0) : null;
        const href = `/ui/runs/${enc(r.run_id)}/curves`;
        return h("tr", { dataset: { run: r.run_id } },
          h("td", {}, h("a", { href, "data-link": true, class: "run-link" }, r.run_id)),
          h("td", {}, r.policies.map((p) => h("span", { class: "chip" },
            h("i", { class: "dot", style: { background: colorOf(r.policies, p) } }), p))),
          h("td", { class: "num" }, fmt(total)),
          h("td", { class: "num" }, fmt(taken)),
          h("td", { class: "num" }, fmt(r.tau)),
          h("td", { title: new Date(r.created_unix_ms).toISOString() }, ago(r.created_unix_ms)));
      }));
      note.textContent = runs.length ? "" : "No runs on this SEE yet. Start one: mutualrl up -c configs/demo.yaml";
    } catch (e) {
      note.textContent = `Could not list runs: ${e.message}`;
    }
    if (!stopped) timer = setTimeout(load, 5000);
  }
  load();
  return { destroy() { stopped = true; clearTimeout(timer); } };
}
