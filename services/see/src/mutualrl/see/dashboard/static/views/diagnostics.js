// Probe diagnostics over a round window: PRP's importance-weight histogram per receiver, THL's
// residual per sender -> receiver pair (and per round where PRP aligns traces), SGT's rescues
// per skill.

import { enc, get } from "../api.js";
import { bars, colorOf, histogram, LinePanel } from "../charts.js";
import { RoundWindow } from "../controls.js";
import { clear, fmt, h } from "../dom.js";

const HIST = "prp_w_loghist/";

export function diagnosticsView(root, { runId, policies, live }) {
  let stopped = false;
  let residualTimer = null;
  const win = new RoundWindow("d-", live, () => { render(); loadResidual(); });
  const prp = h("div", { class: "grid", id: "prp-hist" });
  const residualBox = h("div", { id: "thl-residual" });
  const residualCurve = new LinePanel({ title: "Residual per round, as each trainer aligned its peers' rollouts (PRP)",
    subtitle: "share of the receiver's tokens in multi-token chunks", metric: "thl_multi_token_chunk_share", policies, yRange: [0, 1],
    absent: "reported by the prp probe only (it aligns peer rollouts each round)" });
  const sgt = h("div", { class: "grid", id: "sgt-rescues" });

  clear(root,
    h("div", { class: "toolbar" }, win.el,
      h("span", { class: "muted" }, "Figures are summed (counts) or averaged (shares) over the window.")),
    h("h2", { class: "section" }, "PRP · importance weights w = π_receiver(y) / π_sender(y)"),
    h("p", { class: "muted" }, "Distribution of log w (nats) over every peer sample (sequence level) or THL chunk (chunk level) a policy received, before its weight mode. "
      + "The outer bins hold everything beyond them. Mass far left means the receiver finds its peers' text unlikely: those samples get tiny or dropped weights."),
    prp,
    h("h2", { class: "section" }, "THL · residual"),
    h("p", { class: "muted" }, "What does not align cleanly when a sender's tokens move to a receiver's tokenizer, measured by THL on each sender's newest rollouts in the window."),
    h("div", { class: "split" }, residualBox, residualCurve.el),
    h("h2", { class: "section" }, "SGT · rescued prompts per skill"),
    h("p", { class: "muted" }, "Prompts a policy failed (max own reward < τ) that a peer's verified success rescued, summed over the window."),
    sgt);

  function render() {
    const [a, b] = win.get();
    // PRP histogram, one card per receiving policy.
    const edges = live.keysWith(HIST).map(Number).filter(Number.isFinite).sort((x, y) => x - y);
    if (edges.length === 0) {
      clear(prp, h("p", { class: "muted empty" }, "No importance weights reported: no policy received peer rollouts "
        + "(they come with the prp probe, once peers publish)."));
    } else clear(prp, policies.map((p) => {
      const counts = edges.map((e) => live.sum(p, HIST + e, a, b));
      const total = counts.reduce((x, y) => x + y, 0);
      const body = total > 0
        ? [histogram(edges.map((e, i) => ({ lo: e, hi: i + 1 < edges.length ? edges[i + 1] : Infinity, count: counts[i] })),
          { color: colorOf(policies, p), xlabel: "log w (nats)" }),
        h("p", { class: "stats" },
          `${fmt(total)} weights · mean w ${fmt(live.mean(p, "prp_w_mean", a, b))} · var ${fmt(live.mean(p, "prp_w_var", a, b))}`
          + ` · kept ${fmt(live.mean(p, "prp_w_kept", a, b), 2)} · clipped ${fmt(live.mean(p, "prp_w_clipped", a, b), 2)}`)]
        : h("p", { class: "muted empty" }, "No importance weights in this window: the policy received no peer rollouts (the probe is not prp, or peers had none to give).");
      return h("section", { class: "panel", dataset: { policy: p, weights: total } },
        h("header", {}, h("h3", {}, h("i", { class: "dot", style: { background: colorOf(policies, p) } }), `${p} receiving`)), body);
    }));
    residualCurve.update(policies.map((p) => live.series(p, "thl_multi_token_chunk_share")
      .filter(([r]) => (a === null || r >= a) && (b === null || r <= b))), live.maxRound() !== null);
    // SGT rescues per skill.
    const skills = live.keysWith("rescued/");
    clear(sgt, policies.map((p) => {
      const total = live.sum(p, "rescued_prompts", a, b);
      const items = skills.map((s) => ({ label: s, value: live.sum(p, `rescued/${s}`, a, b), color: colorOf(policies, p), data: { skill: s } }));
      return h("section", { class: "panel", dataset: { policy: p, rescued: total } },
        h("header", {}, h("h3", {}, h("i", { class: "dot", style: { background: colorOf(policies, p) } }), `${p} rescued`),
          h("span", { class: "sub" }, `${fmt(total)} prompts`)),
        items.some((i) => i.value > 0) ? bars(items) : h("p", { class: "muted empty" }, "No rescued prompt in this window."));
    }));
  }

  async function loadResidual() {
    clearTimeout(residualTimer);
    const [a, b] = win.get();
    try {
      const r = await get(`/v1/runs/${enc(runId)}/residual`, { round_min: a, round_max: b, sample: 16 });
      if (stopped) return;
      const cell = new Map(r.pairs.map((p) => [`${p.source_policy}|${p.target_policy}`, p]));
      const allFailed = r.pairs.length > 0 && r.pairs.every((p) => p.error);
      clear(residualBox, allFailed && new Set(r.pairs.map((p) => p.error)).size === 1
        ? h("p", { class: "error" }, r.pairs[0].error)
        : h("section", { class: "panel" }, h("header", {}, h("h3", {}, "Residual by pair, newest rollouts"),
          h("span", { class: "sub" }, "share of receiver tokens in multi-token chunks; tokens sender → receiver")),
        h("table", { class: "heatmap residual" },
          h("thead", {}, h("tr", {}, h("th", { class: "corner" }, "sender ↓  receiver →"),
            policies.map((t) => h("th", { class: "col" }, h("i", { class: "dot", style: { background: colorOf(policies, t) } }), t)))),
          h("tbody", {}, policies.map((s) => h("tr", {}, h("th", { class: "row" }, h("i", { class: "dot", style: { background: colorOf(policies, s) } }), s),
            policies.map((t) => {
              if (s === t) return h("td", { class: "self" }, "·");
              const p = cell.get(`${s}|${t}`);
              if (!p || p.error) return h("td", { class: "cell na", title: p ? p.error : "" }, "n/a");
              const f = p.multi_token_chunk_share;
              return h("td", {
                class: "cell", dataset: { source: s, target: t, share: f },
                style: { background: `rgba(242, 142, 43, ${(0.08 + 0.8 * f).toFixed(3)})` },
                title: `${p.records} records · ${p.source_tokens} → ${p.target_tokens} tokens in ${p.chunks} chunks · round-trip mismatch ${p.roundtrip_mismatch_chars} chars · uncovered ${p.uncovered_bytes} bytes · normalizer changed ${p.normalized_changed_chars} chars`,
              }, h("strong", {}, fmt(f, 2)), h("span", { class: "cell-sub" }, `${p.source_tokens}→${p.target_tokens} tok`));
            })))))));
    } catch (e) {
      clear(residualBox, h("p", { class: "error" }, e.message));
    }
    if (!stopped) residualTimer = setTimeout(loadResidual, 15000);
  }

  render();
  loadResidual();
  const unsub = live.subscribe((changed) => { if (changed) render(); });
  return { destroy() { stopped = true; clearTimeout(residualTimer); unsub(); residualCurve.destroy(); } };
}
