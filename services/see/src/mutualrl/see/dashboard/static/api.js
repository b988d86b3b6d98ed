// SEE's REST API as the dashboard uses it: the bearer token lives in sessionStorage (this tab,
// until it is closed) and goes with every request.

const KEY = "mutualrl.see.token";

export const token = {
  get: () => sessionStorage.getItem(KEY),
  set: (t) => sessionStorage.setItem(KEY, t),
  clear: () => sessionStorage.removeItem(KEY),
};

export class ApiError extends Error {
  constructor(status, detail, field) {
    super(detail || `HTTP ${status}`);
    this.status = status;
    this.field = field;
  }
}

function headers(tok) {
  return tok ? { Authorization: `Bearer ${tok}` } : {};
}

// Listeners told when a data request is refused for its token (it changed on the server).
const onUnauthorized = new Set();
export function whenUnauthorized(fn) { onUnauthorized.add(fn); }

export async function get(path, params = {}) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") q.set(k, v);
  const url = q.toString() ? `${path}?${q}` : path;
  let res;
  try {
    res = await fetch(url, { headers: headers(token.get()), cache: "no-store" });
  } catch (e) {
    throw new ApiError(0, "SEE does not answer (is it still running?)");
  }
  if (!res.ok) {
    let body = {};
    try { body = await res.json(); } catch (e) { /* not JSON: keep the status */ }
    if (res.status === 401) onUnauthorized.forEach((fn) => fn());
    const detail = typeof body.detail === "string" ? body.detail
      : Array.isArray(body.detail) ? body.detail.map((d) => `${(d.loc || []).join(".")}: ${d.msg}`).join("; ")
      : `HTTP ${res.status}`;
    throw new ApiError(res.status, detail, body.field);
  }
  return res.json();
}

// Whether a token is needed and whether `tok` is the right one (an open route: no 401 noise).
export async function session(tok) {
  const res = await fetch("/v1/session", { headers: headers(tok), cache: "no-store" });
  if (!res.ok) throw new ApiError(res.status, `HTTP ${res.status}`);
  return res.json();
}

// Every page of a paged route: asks again with `cursor` set to the answer's `next_cursor` until
// it is null (at most `max` pages); each page goes to `each`.
export async function getPages(path, params, each, max = 100) {
  let cursor = null;
  for (let i = 0; i < max; i++) {
    const r = await get(path, { ...params, cursor });
    each(r);
    if (!r.next_cursor) return;
    cursor = r.next_cursor;
  }
}

export const enc = encodeURIComponent;
