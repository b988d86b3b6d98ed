// One run: its policies with their latest round, a live indicator, and four views in tabs.
// The live metrics poll keeps running across tabs, so switching views keeps every curve.

import { ApiError, enc, get } from "../api.js";
import { colorOf } from "../charts.js";
import { ago, clear, fmt, h } from "../dom.js";
import { LiveMetrics } from "../live.js";
import { curvesView } from "./curves.js";
import { diagnosticsView } from "./diagnostics.js";
import { recordsView } from "./records.js";
import { transfersView } from "./transfers.js";

export const TABS = ["curves", "transfers", "records", "diagnostics"];
const LABELS = { curves: "Curves", transfers: "Transfer matrix", records: "Record browser", diagnostics: "Probe diagnostics" };
const VIEWS = { curves: curvesView, transfers: transfersView, records: recordsView, diagnostics: diagnosticsView };

export class RunPage {
  constructor(app, crumbs, runId, tab) {
    this.app = app;
    this.runId = runId;
    this.tab = tab;
    this.view = null;
    this.live = null;
    this.destroyed = false;
    clear(crumbs, h("a", { href: "/ui/", "data-link": true }, "Runs"), h("span", { class: "sep" }, "/"), h("span", {}, runId));
    clear(app, h("p", { class: "muted pad" }, `Loading run ${runId}…`));
    this.load();
  }

  async load() {
    let run;
    try {
      run = await get(`/v1/runs/${enc(this.runId)}`);
    } catch (e) {
      if (this.destroyed) return;
      return this.missing(e);
    }
    if (this.destroyed) return;
    this.run = run;
    this.policies = run.policies;
    this.live = new LiveMetrics(this.runId, this.policies);
    this.build();
    this.unsub = this.live.subscribe(() => this.refreshHead());
    this.live.start();
    this.setTab(this.tab, true);
  }

  // An unknown run id gets a page that says so, not an error dump. A run that does not exist
  // yet (its trainers are still starting) appears by itself: the page looks again every 3 s.
  missing(e) {
    const notFound = e instanceof ApiError && e.status === 404;
    // 400 from SEE's own id check, 422 from the REST schema's run id pattern.
    const invalid = e instanceof ApiError && (e.status === 400 || e.status === 422);
    clear(this.app, h("div", { class: "notice", id: "run-missing" },
      h("h1", {}, notFound || invalid ? `Run “${this.runId}” not found` : `Run “${this.runId}” could not be loaded`),
      h("p", {}, invalid ? `SEE says the id is not valid: ${e.message}.`
        : notFound ? "This SEE holds no run with that id. It may be misspelt, not created yet (trainers create it "
          + "when they start: this page shows it as soon as it exists), or expired (a run's keys live for its TTL "
          + "after its last write)."
          : `${e.message}. Trying again every few seconds.`),
      h("p", {}, h("a", { href: "/ui/", "data-link": true, class: "primary-link" }, "← All runs on this SEE"))));
    if (!invalid) this.retry = setTimeout(() => this.load(), 3000);
  }

  build() {
    this.chips = new Map();
    const legend = h("div", { class: "legend", id: "policy-legend" }, this.policies.map((p) => {
      const round = h("span", { class: "round" }, "no round yet");
      const reward = h("span", { class: "reward" });
      this.chips.set(p, { round, reward });
      return h("div", { class: "policy", dataset: { policy: p } },
        h("i", { class: "swatch", style: { background: colorOf(this.policies, p) } }),
        h("span", { class: "name" }, p), round, reward);
    }));
    this.liveDot = h("span", { class: "live", id: "live" }, "connecting…");
    this.nav = h("nav", { class: "tabs", role: "tablist" }, TABS.map((t) =>
      h("a", { href: `/ui/runs/${enc(this.runId)}/${t}`, "data-link": true, role: "tab", dataset: { tab: t } }, LABELS[t])));
    this.body = h("div", { class: "tab-body" });
    clear(this.app, h("div", { class: "page" },
      h("div", { class: "run-head" },
        h("div", {}, h("h1", {}, this.runId),
          h("p", { class: "muted" }, `${this.policies.length} policies · τ = ${fmt(this.run.tau)} · created ${ago(this.run.created_unix_ms)}`)),
        this.liveDot),
      legend, this.nav, this.body));
    this.tick = setInterval(() => this.refreshHead(), 1000);
  }

  refreshHead() {
    if (!this.live) return;
    for (const p of this.policies) {
      const c = this.chips.get(p);
      const r = this.live.lastRound(p);
      c.round.textContent = r === null ? "no round yet" : `round ${r}`;
      const v = r === null ? null : this.live.rows.get(p).get(r);
      c.reward.textContent = v && v.reward_mean !== undefined ? `reward ${fmt(v.reward_mean, 3)}` : "";
    }
    const l = this.live;
    if (l.error) {
      this.liveDot.className = "live down";
      this.liveDot.textContent = `SEE unreachable: ${l.error.message}`;
    } else if (l.newestMs === null) {
      this.liveDot.className = "live idle";
      this.liveDot.textContent = l.lastPoll ? "no round reported yet" : "connecting…";
    } else {
      // Age of the newest round by the trainer's clock (a clock ahead of ours counts as now).
      const age = Math.max(0, Date.now() - l.newestMs);
      const on = age < 30000;
      this.liveDot.className = on ? "live on" : "live idle";
      this.liveDot.textContent = on ? `live · last round ${(age / 1000).toFixed(0)} s ago` : `idle · last round ${ago(l.newestMs)}`;
    }
  }

  setTab(tab, force = false) {
    if (!this.live) { this.tab = tab; return; }
    if (!force && tab === this.tab && this.view) return;
    this.tab = tab;
    if (this.view) this.view.destroy();
    for (const a of this.nav.children) a.setAttribute("aria-selected", String(a.dataset.tab === tab));
    clear(this.body);
    this.view = VIEWS[tab](this.body, { runId: this.runId, run: this.run, policies: this.policies, live: this.live });
    document.title = `${this.runId} · ${LABELS[tab]} · MutualRL`;
  }

  destroy() {
    this.destroyed = true;
    clearTimeout(this.retry);
    clearInterval(this.tick);
    if (this.view) this.view.destroy();
    if (this.unsub) this.unsub();
    if (this.live) this.live.stop();
  }
}
