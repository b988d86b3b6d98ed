// The dashboard's entry: asks for the token when SEE needs one, then routes
//   /ui/                    every run
//   /ui/runs/<run>/<tab>    one run: curves | transfers | records | diagnostics

import { ApiError, session, token, whenUnauthorized } from "./api.js";
import { clear, h } from "./dom.js";
import { runsPage } from "./views/runs.js";
import { RunPage, TABS } from "./views/run.js";

const app = document.getElementById("app");
const crumbs = document.getElementById("crumbs");
const status = document.getElementById("status");
let page = null; // the mounted page: {destroy(), runId?, setTab?()}
let authRequired = false;

function parse(path) {
  const m = path.match(/^\/ui\/runs\/([^/]+)(?:\/([^/]*))?\/?$/);
  if (m) return { page: "run", runId: decodeURIComponent(m[1]), tab: m[2] || "curves" };
  if (path === "/ui" || path === "/ui/" || path === "/ui/runs" || path === "/ui/runs/") return { page: "runs" };
  return { page: "missing" };
}

export function navigate(url, replace = false) {
  if (replace) history.replaceState({}, "", url);
  else history.pushState({}, "", url);
  route();
}

function unmount() {
  if (page) page.destroy();
  page = null;
}

function route() {
  const where = parse(location.pathname);
  if (where.page === "run" && !TABS.includes(where.tab)) {
    return navigate(`/ui/runs/${encodeURIComponent(where.runId)}/curves`, true);
  }
  if (where.page === "run" && page && page.runId === where.runId) {
    page.setTab(where.tab); // same run: keep its live data, switch the view
    return;
  }
  unmount();
  clear(crumbs);
  if (where.page === "runs") page = runsPage(app, crumbs);
  else if (where.page === "run") page = new RunPage(app, crumbs, where.runId, where.tab);
  else {
    clear(app, h("div", { class: "notice" }, h("h1", {}, "No such page"),
      h("p", {}, `${location.pathname} is not a page of this dashboard.`),
      h("p", {}, h("a", { href: "/ui/", "data-link": true }, "All runs"))));
  }
}

function showStatus() {
  clear(status);
  if (!authRequired) return;
  status.append(h("span", { class: "auth-ok", title: "The bearer token is kept in this tab only." }, "token ✓"),
    h("button", { class: "link", onclick: () => { token.clear(); unmount(); gate(null); } }, "forget"));
}

// The token form: SEE's /v1/session says whether a token is right before any data is asked for.
function gate(message) {
  unmount();
  clear(crumbs);
  clear(status);
  const input = h("input", { type: "password", id: "token", name: "token", autocomplete: "current-password",
    placeholder: "bearer token", required: true, "aria-label": "bearer token" });
  const error = h("p", { class: "error", role: "alert", id: "token-error" }, message || "");
  error.hidden = !message;
  const button = h("button", { type: "submit", class: "primary" }, "Open dashboard");
  const form = h("form", { class: "gate", id: "token-form" },
    h("h1", {}, "This SEE needs a token"),
    h("p", { class: "muted" }, "Enter the bearer token SEE was started with (MUTUALRL_AUTH_TOKEN or see.auth_token). "
      + "It is kept for this browser tab only, until the tab closes."),
    input, button, error);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    button.disabled = true;
    try {
      const s = await session(input.value.trim());
      if (s.authenticated) {
        token.set(input.value.trim());
        showStatus();
        route();
        return;
      }
      error.textContent = "Token refused: SEE did not accept it.";
    } catch (err) {
      error.textContent = `SEE did not answer: ${err.message}`;
    }
    error.hidden = false;
    button.disabled = false;
    input.select();
  });
  clear(app, h("div", { class: "gate-wrap" }, form));
  input.focus();
}

document.addEventListener("click", (e) => {
  const a = e.target.closest("a[data-link]");
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  e.preventDefault();
  navigate(a.getAttribute("href"));
});
window.addEventListener("popstate", route);
whenUnauthorized(() => { token.clear(); gate("SEE no longer accepts the token kept for this tab."); });

async function start() {
  let s;
  try {
    s = await session(token.get());
  } catch (err) {
    const why = err instanceof ApiError ? err.message : String(err);
    clear(app, h("div", { class: "notice" }, h("h1", {}, "SEE does not answer"), h("p", {}, why)));
    return;
  }
  authRequired = s.auth_required;
  if (s.auth_required && !s.authenticated) {
    const had = token.get();
    token.clear();
    gate(had ? "The token kept for this tab is no longer accepted." : null);
    return;
  }
  showStatus();
  route();
}

start();
