// A window of rounds, shared by the views that sum or average over one: two number inputs
// (empty = open-ended) and quick choices.

import { debounce, h } from "./dom.js";

export class RoundWindow {
  // prefix: id prefix of the inputs; live: the run's LiveMetrics (for "last N");
  // onChange: called (debounced while typing) when the window changes.
  constructor(prefix, live, onChange) {
    this.live = live;
    this.onChange = onChange;
    this.lo = h("input", { type: "number", min: 0, id: `${prefix}round-min`, placeholder: "first", "aria-label": "first round" });
    this.hi = h("input", { type: "number", min: 0, id: `${prefix}round-max`, placeholder: "last", "aria-label": "last round" });
    const typed = debounce(onChange, 300);
    this.lo.addEventListener("input", typed);
    this.hi.addEventListener("input", typed);
    this.el = [
      h("label", {}, "Rounds ", this.lo, " to ", this.hi),
      h("button", { id: `${prefix}all-rounds`, onclick: () => this.set(null, null) }, "All rounds"),
      h("button", { onclick: () => this.last(25) }, "Last 25"),
      h("button", { onclick: () => this.last(100) }, "Last 100"),
    ];
  }

  // [first, last], null where open.
  get() {
    return [this.lo.value === "" ? null : Number(this.lo.value), this.hi.value === "" ? null : Number(this.hi.value)];
  }

  set(a, b) {
    this.lo.value = a === null ? "" : String(a);
    this.hi.value = b === null ? "" : String(b);
    this.onChange();
  }

  last(n) {
    const r = this.live.maxRound();
    if (r === null) this.set(null, null);
    else this.set(Math.max(0, r - n + 1), r);
  }
}
