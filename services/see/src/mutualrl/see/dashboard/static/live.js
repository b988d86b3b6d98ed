// A run's per-round metric rows, kept up to date by polling GET /v1/runs/{run}/metrics with a
// cursor once a second (a new round shows within ~1 s of the trainer reporting it).

import { enc, get } from "./api.js";

export const POLL_MS = 1000;

// Seconds a round's rollouts and update ran side by side, at least: what their sum exceeds the
// round's own time (its waits for peers left out) by. 0 when they ran one after the other.
export function withOverlap(v) {
  const round = v.cost_s ?? v.step_s;
  // with a rollout worker `rollout_s` is the learner's wait; `generate_s` the sampling itself
  const sampling = v.generate_s ?? v.rollout_s;
  if (v.overlap_s === undefined && sampling !== undefined && v.update_s !== undefined && round !== undefined)
    v.overlap_s = Math.max(0, sampling + v.update_s - round);
  return v;
}

export class LiveMetrics {
  constructor(runId, policies) {
    this.runId = runId;
    this.policies = policies;
    this.rows = new Map(policies.map((p) => [p, new Map()])); // policy -> round -> values
    this.cursor = null;
    this.lastUpdate = null; // Date.now() of the last poll that brought rows
    this.newestMs = null; // when the newest round was finished (the trainer's clock, Unix ms)
    this.lastPoll = null;
    this.error = null;
    this.listeners = new Set();
    this.stopped = false;
    this.timer = null;
  }

  start() { this.poll(); return this; }

  stop() { this.stopped = true; clearTimeout(this.timer); this.listeners.clear(); }

  subscribe(fn) { this.listeners.add(fn); return () => this.listeners.delete(fn); }

  async poll() {
    if (this.stopped) return;
    let changed = false;
    try {
      for (let page = 0; page < 50; page++) {
        const r = await get(`/v1/runs/${enc(this.runId)}/metrics`, { after: this.cursor, limit: 5000 });
        for (const row of r.rows) {
          if (!this.rows.has(row.policy_id)) this.rows.set(row.policy_id, new Map());
          // A round reported again (a resumed trainer) replaces the earlier row.
          this.rows.get(row.policy_id).set(row.round, withOverlap({ ...row.values, _ms: row.unix_ms }));
          this.newestMs = Math.max(this.newestMs ?? 0, row.unix_ms);
          changed = true;
        }
        this.cursor = r.cursor;
        if (!r.more) break;
      }
      this.error = null;
    } catch (e) {
      this.error = e;
    }
    this.lastPoll = Date.now();
    if (changed) this.lastUpdate = Date.now();
    for (const fn of this.listeners) fn(changed);
    if (!this.stopped) this.timer = setTimeout(() => this.poll(), POLL_MS);
  }

  // [{round, value}] of one metric for one policy, in round order.
  series(policy, key) {
    const m = this.rows.get(policy);
    if (!m) return [];
    const out = [];
    for (const [round, v] of m) if (v[key] !== undefined) out.push([round, v[key]]);
    return out.sort((a, b) => a[0] - b[0]);
  }

  lastRound(policy) {
    const m = this.rows.get(policy);
    if (!m || m.size === 0) return null;
    let best = -1;
    for (const r of m.keys()) if (r > best) best = r;
    return best;
  }

  maxRound() {
    let best = null;
    for (const p of this.rows.keys()) {
      const r = this.lastRound(p);
      if (r !== null && (best === null || r > best)) best = r;
    }
    return best;
  }

  // Every metric name with a prefix (e.g. "heldout/"), suffixes sorted.
  keysWith(prefix) {
    const out = new Set();
    for (const m of this.rows.values())
      for (const v of m.values())
        for (const k of Object.keys(v)) if (k.startsWith(prefix)) out.add(k.slice(prefix.length));
    return [...out].sort();
  }

  // Sum of one metric over a round window, per policy.
  sum(policy, key, lo, hi) {
    const m = this.rows.get(policy);
    let s = 0;
    if (!m) return s;
    for (const [r, v] of m) if (v[key] !== undefined && (lo === null || r >= lo) && (hi === null || r <= hi)) s += v[key];
    return s;
  }

  // Mean of one metric over a round window (rounds that report it), or null.
  mean(policy, key, lo, hi) {
    const m = this.rows.get(policy);
    let s = 0, n = 0;
    if (!m) return null;
    for (const [r, v] of m) if (v[key] !== undefined && (lo === null || r >= lo) && (hi === null || r <= hi)) { s += v[key]; n++; }
    return n ? s / n : null;
  }
}
