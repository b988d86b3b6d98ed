// What MWRA gave each policy and how the policy spent it: a table of the latest round (threads,
// rollout workers and their threads, the learner's threads, seconds of rollouts, update and their
// overlap) and, per round, curves of the same figures. Every trainer's metric row carries them.

import { colorOf } from "../charts.js";
import { fmt, h } from "../dom.js";

export const COMPUTE = [
  { metric: "threads", title: "Threads (MWRA)", subtitle: "the policy's share of the pool; learner and rollout workers together" },
  { metric: "rollout_workers", title: "Rollout workers (MWRA)", subtitle: "0: rollouts in the learner's process",
    absent: "no trainer reported rollout workers: rollouts run in-process" },
  { metric: "rollout_s", title: "Rollout time (s)", smooth: true },
  { metric: "update_s", title: "Update time (s)", smooth: true, absent: "not reported by this run's trainers" },
  { metric: "overlap_s", title: "Rollout ‖ update overlap (s)", subtitle: "rollout + update − round time (at least)", smooth: true,
    absent: "needs rollout_s and update_s in the rows" },
];

const HEAD = ["policy", "round", "threads", "rollout workers", "rollout threads", "learner threads",
  "rollout s", "update s", "overlap s", "round s"];

// One row per policy: the figures of its latest round that reports threads.
export class ComputeTable {
  constructor(policies) {
    this.policies = policies;
    this.body = h("tbody");
    this.el = h("div", { class: "card flush" }, h("table", { class: "runs", id: "mwra-plan" },
      h("thead", {}, h("tr", {}, HEAD.map((c) => h("th", {}, c)))), this.body));
  }

  update(live) {
    this.body.replaceChildren(...this.policies.map((p) => {
      const round = live.lastRound(p);
      const v = round === null ? {} : live.rows.get(p).get(round);
      const threads = v.threads, rt = v.rollout_threads ?? 0;
      const cells = [round, threads, v.rollout_workers ?? 0, rt,
        threads === undefined ? undefined : threads - rt, v.generate_s ?? v.rollout_s, v.update_s, v.overlap_s, v.step_s];
      return h("tr", { dataset: { policy: p } },
        h("td", {}, h("i", { class: "dot", style: { background: colorOf(this.policies, p) } }), " ", p),
        cells.map((x, i) => h("td", { dataset: { col: HEAD[i + 1] } }, x === undefined || x === null ? "–" : fmt(x, 2))));
    }));
  }
}
