// Charts: line panels over rounds (uPlot, vendored), histograms and bars drawn as plain SVG/HTML.

import { fmt, h, svg } from "./dom.js";

// Tableau 10: distinguishable for any N up to 10, then repeats with a dash.
const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
  "#ff9da7", "#9c755f", "#bab0ac"];

export function colorOf(policies, policy) {
  const i = policies.indexOf(policy);
  return PALETTE[(i < 0 ? 0 : i) % PALETTE.length];
}

export function dashOf(policies, policy) {
  return policies.indexOf(policy) >= PALETTE.length ? [6, 3] : undefined;
}

// Exponential moving average (alpha = weight of the past), as TensorBoard's smoothing slider.
export function ema(points, alpha) {
  if (!alpha) return points;
  let s = null;
  return points.map(([x, y]) => { s = s === null ? y : alpha * s + (1 - alpha) * y; return [x, s]; });
}

// One x array (every round any policy reported) and one y array per policy (null where absent).
export function align(seriesByPolicy) {
  const xs = new Set();
  for (const pts of seriesByPolicy) for (const [x] of pts) xs.add(x);
  const x = [...xs].sort((a, b) => a - b);
  const index = new Map(x.map((v, i) => [v, i]));
  const ys = seriesByPolicy.map((pts) => {
    const y = new Array(x.length).fill(null);
    for (const [r, v] of pts) y[index.get(r)] = v;
    return y;
  });
  return [x, ...ys];
}

// A titled panel with a uPlot line chart: one series per policy, x = round.
export class LinePanel {
  constructor({ title, subtitle, metric, policies, yRange, markers = false, height = 190, absent }) {
    this.policies = policies;
    this.absent = absent;
    this.latest = [];
    this.metric = metric;
    this.markers = markers;
    this.yRange = yRange;
    this.height = height;
    this.plotEl = h("div", { class: "plot" });
    this.empty = h("div", { class: "plot-empty" }, "waiting for the first round…");
    this.el = h("section", { class: "panel", dataset: { metric } },
      h("header", {}, h("h3", {}, title), subtitle ? h("span", { class: "sub" }, subtitle) : null),
      this.plotEl, this.empty);
    this.plot = null;
    this.observer = new ResizeObserver(() => this.resize());
    this.observer.observe(this.plotEl);
  }

  options(width) {
    const range = this.yRange;
    // Fixed bounds where a metric has them ([0, 1] shares); otherwise a padded range that
    // stays readable when every value is equal (uPlot would show 0..100 for all zeros).
    const yRange = (u, lo, hi) => {
      if (lo === null || hi === null) return range || [0, 1];
      if (range) return [Math.min(range[0], lo), Math.max(range[1], hi)];
      if (lo === hi) return [lo - (Math.abs(lo) || 1) * 0.5, hi + (Math.abs(hi) || 1) * 0.5];
      const pad = (hi - lo) * 0.08;
      return [lo >= 0 && lo - pad < 0 ? 0 : lo - pad, hi + pad];
    };
    // Off the chart the legend shows each policy's latest value (not dashes).
    const value = (u, v, si, i) => fmt(v === null && (i === null || i === u.data[0].length - 1) ? this.latest[si] : v);
    return {
      width, height: this.height,
      scales: { x: { time: false }, y: { range: yRange } },
      series: [{ label: "round", value: (u, v) => (v === null || v === undefined ? "latest" : String(v)) },
        ...this.policies.map((p) => ({
          label: p, stroke: colorOf(this.policies, p), dash: dashOf(this.policies, p), width: 1.75,
          spanGaps: true, value,
          points: { show: this.markers, size: 5, fill: colorOf(this.policies, p) },
        }))],
      axes: [
        { stroke: "#5b6472", grid: { stroke: "#eef0f3" }, ticks: { stroke: "#d9dde3" }, size: 32 },
        { stroke: "#5b6472", grid: { stroke: "#eef0f3" }, ticks: { stroke: "#d9dde3" }, size: 48,
          values: (u, vals) => vals.map((v) => fmt(v, 2)) },
      ],
      legend: { live: true },
      cursor: { drag: { x: true, y: false }, points: { size: 6 } },
    };
  }

  // seriesByPolicy: one [[round, value], ...] per policy (same order as `policies`);
  // anyRows: the run has reported rounds (so an empty panel means "not reported").
  update(seriesByPolicy, anyRows = false) {
    const counts = {};
    this.policies.forEach((p, i) => { counts[p] = seriesByPolicy[i].length; });
    this.el.dataset.points = JSON.stringify(counts);
    const total = Object.values(counts).reduce((a, b) => a + b, 0);
    this.empty.hidden = total > 0;
    if (total === 0) {
      this.empty.textContent = anyRows ? (this.absent || "not reported by this run's trainers") : "waiting for the first round…";
      return;
    }
    this.latest = [null, ...seriesByPolicy.map((pts) => (pts.length ? pts[pts.length - 1][1] : null))];
    const data = align(seriesByPolicy);
    if (!this.plot) {
      if (typeof uPlot === "undefined") return;
      this.plot = new uPlot(this.options(Math.max(240, this.plotEl.clientWidth)), data, this.plotEl);
    } else {
      this.plot.setData(data);
    }
  }

  resize() {
    if (this.plot && this.plotEl.clientWidth > 0) this.plot.setSize({ width: this.plotEl.clientWidth, height: this.height });
  }

  destroy() {
    this.observer.disconnect();
    if (this.plot) this.plot.destroy();
  }
}

// Histogram of counts over bins [{lo, hi, count}] as SVG bars with edge labels.
export function histogram(bins, { color = "#4e79a7", width = 360, height = 150, xlabel = "" } = {}) {
  const pad = { l: 40, r: 8, t: 8, b: 34 };
  const w = width - pad.l - pad.r, hgt = height - pad.t - pad.b;
  const max = Math.max(1, ...bins.map((b) => b.count));
  const bw = w / Math.max(1, bins.length);
  const root = svg("svg", { class: "hist", viewBox: `0 0 ${width} ${height}`, width: "100%", role: "img" });
  for (const f of [0, 0.5, 1]) {
    const y = pad.t + hgt * (1 - f);
    root.append(svg("line", { x1: pad.l, x2: pad.l + w, y1: y, y2: y, class: "grid" }),
      svg("text", { x: pad.l - 4, y: y + 3, class: "tick", "text-anchor": "end" }, fmt(Math.round(max * f))));
  }
  bins.forEach((b, i) => {
    const bh = (hgt * b.count) / max;
    const rect = svg("rect", { x: pad.l + i * bw + 1, y: pad.t + hgt - bh, width: Math.max(1, bw - 2), height: bh, fill: color, rx: 1.5 },
      svg("title", {}, `log w in [${fmt(b.lo, 0)}, ${fmt(b.hi, 0)}): ${b.count.toLocaleString("en-US")}`));
    rect.dataset.lo = b.lo;
    rect.dataset.count = b.count;
    root.append(rect);
    if (i % Math.ceil(bins.length / 9) === 0)
      root.append(svg("text", { x: pad.l + i * bw, y: pad.t + hgt + 13, class: "tick", "text-anchor": "middle" }, fmt(b.lo, 0)));
  });
  root.append(svg("line", { x1: pad.l, x2: pad.l + w, y1: pad.t + hgt, y2: pad.t + hgt, class: "axis" }),
    svg("text", { x: pad.l + w / 2, y: height - 4, class: "label", "text-anchor": "middle" }, xlabel));
  return root;
}

// Horizontal bars [{label, value, color}] scaled to the largest value.
export function bars(items, { unit = "" } = {}) {
  const max = Math.max(1e-12, ...items.map((i) => i.value));
  return h("div", { class: "bars" }, items.map((it) => h("div", { class: "bar-row", dataset: it.data || {} },
    h("span", { class: "bar-label" }, it.label),
    h("span", { class: "bar-track" }, h("span", { class: "bar-fill", style: { width: `${(100 * it.value) / max}%`, background: it.color } })),
    h("span", { class: "bar-value" }, `${fmt(it.value, 2)}${unit}`))));
}
