// Record browser: filter a run's records by policy, kind, round, prompt and verifier outcome;
// show one record's text with its token boundaries under the sender's tokenizer and, beside
// it, under each receiver's tokenizer with THL's chunks shaded and each chunk's log-prob sum.

import { enc, get } from "../api.js";
import { colorOf } from "../charts.js";
import { clear, debounce, fmt, h } from "../dom.js";

const KINDS = ["ROLLOUT", "VERIFIED_SUCCESS", "REWARD_STATS"];
const PAGE = 50;

// Split [start, end) of the text (an array of code points: offsets count code points) into
// pieces: the text of each token, text no token covers ("gap"), and tokens that cover no text
// of their own ("mark": special tokens, byte pieces of one character). The pieces' texts always
// concatenate to exactly text[start:end].
export function pieces(cps, tokens, from, to, start, end) {
  const out = [];
  let cur = start;
  for (let i = from; i < to; i++) {
    const t = tokens[i];
    const s = Math.max(t.start, cur), e = Math.min(t.end, end);
    if (t.start > cur && cur < end) {
      const g = Math.min(t.start, end);
      out.push({ kind: "gap", text: cps.slice(cur, g).join("") });
      cur = g;
    }
    if (e > s) {
      out.push({ kind: "tok", text: cps.slice(s, e).join(""), token: t, index: i });
      cur = e;
    } else {
      out.push({ kind: "mark", token: t, index: i });
    }
  }
  if (cur < end) out.push({ kind: "gap", text: cps.slice(cur, end).join("") });
  return out;
}

function tokenTitle(p) {
  const t = p.token;
  const lp = t.logprob === null || t.logprob === undefined ? "" : ` · log p ${fmt(t.logprob, 3)} (p ${fmt(Math.exp(t.logprob), 3)})`;
  return `token #${p.index} · id ${t.id} · chars [${t.start}, ${t.end})${lp}`;
}

function renderPieces(list, { surprise = false } = {}) {
  return list.map((p, j) => {
    if (p.kind === "gap") return h("span", { class: "piece gap", title: "text no token covers" }, p.text);
    if (p.kind === "mark") return h("span", { class: "mark", title: `${tokenTitle(p)} (covers no text of its own)` }, "◦");
    const el = h("span", { class: `piece tok ${p.index % 2 ? "odd" : "even"}`, title: tokenTitle(p), dataset: { i: p.index } }, p.text);
    if (surprise && p.token.logprob !== null && p.token.logprob !== undefined) {
      const a = Math.min(1, -p.token.logprob / 4);
      el.style.boxShadow = `inset 0 -3px 0 rgba(225, 87, 89, ${a.toFixed(2)})`;
    }
    return el;
  });
}

function senderStrip(text, sender) {
  const cps = Array.from(text);
  return h("div", { class: "tokens sender", dataset: { policy: sender.policy_id } },
    renderPieces(pieces(cps, sender.tokens, 0, sender.tokens.length, 0, cps.length), { surprise: true }));
}

function chunkStrip(text, sender, recv) {
  const cps = Array.from(text);
  return h("div", { class: "chunks", dataset: { receiver: recv.policy_id } }, recv.chunks.map((c, i) => {
    const lp = c.logprob_sum === null ? "" : fmt(c.logprob_sum, 2);
    return h("span", {
      class: `chunk ${c.one_to_one ? "one" : "multi"} ${i % 2 ? "odd" : "even"}`,
      dataset: { i, lp: c.logprob_sum ?? "" },
      title: `chunk ${i} · chars [${c.char_start}, ${c.char_end}) · sender tokens ${c.source_end - c.source_start} → receiver tokens ${c.target_end - c.target_start}`
        + (c.logprob_sum === null ? "" : ` · Σ log p = ${fmt(c.logprob_sum, 4)}`) + (c.one_to_one ? "" : " · not one-to-one"),
    },
    h("span", { class: "src" }, renderPieces(pieces(cps, sender.tokens, c.source_start, c.source_end, c.char_start, c.char_end))),
    h("span", { class: "dst" }, renderPieces(pieces(cps, recv.tokens, c.target_start, c.target_end, c.char_start, c.char_end))),
    h("span", { class: "lp" }, lp));
  }));
}

export function recordsView(root, { runId, policies, live }) {
  let stopped = false;
  const params = new URLSearchParams(location.search);
  const f = {
    policy: h("select", { id: "f-policy", "aria-label": "policy" }, h("option", { value: "" }, "any policy"), policies.map((p) => h("option", { value: p }, p))),
    kind: h("select", { id: "f-kind", "aria-label": "kind" }, KINDS.map((k) => h("option", { value: k }, k)), h("option", { value: "" }, "any kind")),
    roundMin: h("input", { type: "number", min: 0, id: "f-round-min", placeholder: "from", "aria-label": "from round" }),
    roundMax: h("input", { type: "number", min: 0, id: "f-round-max", placeholder: "to", "aria-label": "to round" }),
    prompt: h("input", { type: "text", id: "f-prompt", placeholder: "prompt id", "aria-label": "prompt id", spellcheck: "false" }),
    verified: h("select", { id: "f-verified", "aria-label": "verified" }, [["", "any outcome"], ["true", "verified"], ["false", "not verified"]].map(([v, l]) => h("option", { value: v }, l))),
  };
  f.policy.value = params.get("policy") || "";
  f.kind.value = params.has("kind") ? params.get("kind") : "ROLLOUT";
  f.prompt.value = params.get("prompt") || "";
  f.verified.value = params.get("verified") || "";
  if (params.has("round_min") || params.has("round_max")) {
    f.roundMin.value = params.get("round_min") || "";
    f.roundMax.value = params.get("round_max") || "";
  } else {
    const r = live.maxRound(); // start near the newest rounds: that is what one watches
    if (r !== null) f.roundMin.value = String(Math.max(0, r - 1));
  }
  const tbody = h("tbody");
  const more = h("button", { id: "more", hidden: true }, "Load more");
  const note = h("p", { class: "muted small", id: "list-note" });
  const detail = h("div", { class: "detail", id: "detail" }, h("p", { class: "muted pad" }, "Pick a record to see its tokens under every policy's tokenizer."));
  let cursor = null;
  let selected = params.get("record");

  const filters = h("form", { class: "filters", id: "filters" },
    f.policy, f.kind, h("span", { class: "pair" }, f.roundMin, f.roundMax), f.prompt, f.verified,
    h("button", { type: "submit", class: "primary" }, "Show"));
  filters.addEventListener("submit", (e) => { e.preventDefault(); restart(); });
  const auto = debounce(() => restart(), 400);
  for (const el of Object.values(f)) el.addEventListener(el.tagName === "SELECT" ? "change" : "input", auto);
  more.addEventListener("click", () => page(false));

  clear(root, h("div", { class: "browser" },
    h("div", { class: "list-col" }, filters,
      h("div", { class: "card flush list" }, h("table", { class: "records", id: "records" },
        h("thead", {}, h("tr", {}, ["round", "policy", "kind", "prompt", "reward", "text"].map((c) => h("th", {}, c)))), tbody)),
      h("div", { class: "list-foot" }, note, more)),
    detail));

  // Every policy's records of one prompt in one round: how each answered it, side by side.
  function samePrompt(prompt, round) {
    f.policy.value = "";
    f.kind.value = "";
    f.prompt.value = prompt;
    f.roundMin.value = String(round);
    f.roundMax.value = String(round);
    f.verified.value = "";
    restart();
  }

  function query() {
    return {
      policy: f.policy.value, kind: f.kind.value, round_min: f.roundMin.value, round_max: f.roundMax.value,
      prompt: f.prompt.value.trim(), verified: f.verified.value,
    };
  }

  function syncUrl() {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query())) if (v !== "" && !(k === "kind" && v === "ROLLOUT")) q.set(k, v);
    if (f.kind.value === "") q.set("kind", "");
    if (selected) q.set("record", selected);
    const s = q.toString();
    history.replaceState({}, "", location.pathname + (s ? `?${s}` : ""));
  }

  function restart() {
    cursor = null;
    clear(tbody);
    syncUrl();
    page(true);
  }

  async function page(first) {
    more.hidden = true;
    note.textContent = "loading…";
    let shown = first ? 0 : tbody.children.length;
    let scanned = 0;
    try {
      // A sparse filter may match nothing in one scan: keep scanning a little before giving up.
      for (let call = 0; call < 12; call++) {
        const r = await get(`/v1/runs/${enc(runId)}/records`, { ...query(), cursor, limit: PAGE });
        if (stopped) return;
        scanned += r.scanned;
        for (const rec of r.records) tbody.append(row(rec));
        shown += r.records.length;
        cursor = r.next_cursor;
        if (!cursor || r.records.length > 0) break;
      }
      note.textContent = `${shown} record${shown === 1 ? "" : "s"} shown` + (cursor ? "" : " · end of the listing")
        + (shown === 0 && cursor ? ` · none in ${scanned.toLocaleString("en-US")} entries scanned` : "");
      more.hidden = !cursor;
      if (first && selected) show(selected);
      else if (first && !selected && tbody.firstChild) tbody.firstChild.click();
    } catch (e) {
      note.textContent = e.message;
    }
  }

  function row(rec) {
    const tr = h("tr", { dataset: { record: rec.record_id }, class: rec.record_id === selected ? "sel" : "", tabindex: 0 },
      h("td", { class: "num" }, rec.round),
      h("td", {}, h("i", { class: "dot", style: { background: colorOf(policies, rec.policy_id) } }), rec.policy_id),
      h("td", {}, h("span", { class: `badge k-${rec.kind}` }, rec.kind.replace("_", " ").toLowerCase())),
      h("td", { class: "mono" }, rec.prompt_id),
      h("td", { class: "num" }, fmt(rec.reward, 2), rec.verified ? h("span", { class: "ok", title: "verified" }, " ✓") : ""),
      h("td", { class: "mono preview" }, rec.text_preview));
    tr.addEventListener("click", () => { selected = rec.record_id; syncUrl(); for (const r of tbody.children) r.classList.toggle("sel", r === tr); show(rec.record_id); });
    tr.addEventListener("keydown", (e) => { if (e.key === "Enter") tr.click(); });
    return tr;
  }

  async function show(recordId) {
    clear(detail, h("p", { class: "muted pad" }, "Asking THL for every receiver's tokens…"));
    let a;
    try {
      a = await get(`/v1/runs/${enc(runId)}/alignment`, { record_id: recordId });
    } catch (e) {
      clear(detail, h("p", { class: "error pad" }, e.message));
      return;
    }
    if (stopped || selected !== recordId) return;
    const s = a.sender;
    const lpTotal = s.tokens.some((t) => t.logprob !== null) ? s.tokens.reduce((x, t) => x + (t.logprob || 0), 0) : null;
    clear(detail,
      h("div", { class: "rec-head", dataset: { record: a.record_id } },
        h("div", { class: "rec-id mono" }, a.record_id),
        h("div", { class: "facts" },
          h("span", { class: `badge k-${a.kind}` }, a.kind.replace("_", " ").toLowerCase()),
          h("span", {}, h("i", { class: "dot", style: { background: colorOf(policies, s.policy_id) } }), s.policy_id),
          h("span", {}, `round ${a.round}`), h("span", { class: "mono" }, `prompt ${a.prompt_id}`),
          h("span", {}, `reward ${fmt(a.reward, 3)}`),
          h("button", { class: "small-btn", id: "same-prompt", title: "every policy's records of this prompt",
            onclick: () => samePrompt(a.prompt_id, a.round) }, "all answers to this prompt"))),
      h("div", { class: "prompt" }, h("span", { class: "label" }, "problem"), h("span", { class: "mono" }, a.prompt_text || "–")),
      a.rendered_prompt ? h("div", { class: "prompt rendered" }, h("span", { class: "label" }, `${s.policy_id}'s rendering`),
        h("span", { class: "mono" }, a.rendered_prompt)) : null,
      a.peer_renderings.map((r) => h("div", { class: "prompt rendered", dataset: { rendering: r.policy_id } },
        h("span", { class: "label" }, `${r.policy_id}'s rendering` + (r.record_id && r.round !== a.round ? ` (round ${r.round})` : "")),
        r.rendered_prompt ? h("span", { class: "mono" }, r.rendered_prompt)
          : h("span", { class: "muted" }, r.record_id ? "plain text (no chat template)" : "no rollout of this prompt yet"))),
      h("section", { class: "side" },
        h("h3", {}, "Sender", h("i", { class: "dot", style: { background: colorOf(policies, s.policy_id) } }), s.policy_id,
          h("span", { class: "sub" }, ` tokenizer ${s.tokenizer_id} · ${s.tokens.length} tokens`
            + (s.source === "thl" ? " (the record carries none: encoded by THL)" : "")
            + (lpTotal === null ? "" : ` · Σ log p = ${fmt(lpTotal, 3)}`))),
        s.error ? h("p", { class: "error" }, s.error) : senderStrip(a.text, s),
        h("p", { class: "muted small" }, "Boxes are tokens; the red underline grows with the token's surprise (−log p under the sender's sampling distribution).")),
      a.receivers.map((r) => h("section", { class: "side receiver", dataset: { receiver: r.policy_id } },
        h("h3", {}, "Receiver", h("i", { class: "dot", style: { background: colorOf(policies, r.policy_id) } }), r.policy_id,
          h("span", { class: "sub" }, r.error ? "" : ` tokenizer ${r.tokenizer_id} · ${r.tokens.length} tokens · ${r.chunks.length} chunks`
            + (r.residual ? ` · multi-token share ${fmt(r.residual.multi_token_chunk_share, 2)}` : "")
            + (r.residual && r.residual.roundtrip_mismatch_chars ? ` · round-trip mismatch ${r.residual.roundtrip_mismatch_chars} chars` : ""))),
        r.error ? h("p", { class: "error" }, r.error) : chunkStrip(a.text, s, r))),
      a.receivers.length ? h("p", { class: "muted small" }, "Each column is one THL chunk: the sender's tokens on top, the receiver's below, the chunk's "
        + "log-prob sum (the sender's log-probs THL moves onto the receiver's tokens) underneath. Amber chunks do not pair one to one.") : null);
  }

  restart();
  return { destroy() { stopped = true; } };
}
