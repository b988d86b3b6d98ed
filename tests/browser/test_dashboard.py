"""SEE's dashboard in a real browser against a real short run (`mutualrl up`, three policies with
byte-BPE, character and Unigram tokenizers, probe PRP at THL chunk level, bearer token on).

The tests run in file order on one run: the token gate and the live curves while it trains,
then the trainers are stopped and the transfer heatmap is compared with GetRunStats, the record
browser's chunks with the records' texts, then the diagnostics, an unknown run and the run list.
Waits are generous (a loaded 2-core machine); nothing sleeps for a fixed time as an assertion.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import statistics
import time
from typing import Any

import pytest

# The first test also waits for the run to start (set-up counts against its timeout).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
POLICIES = ["gpt2-bpe", "llama-char", "qwen2-unigram"]  # conftest's run
LiveRun = Page = Any  # conftest's types (a conftest is not imported by name)

POINTS_JS = """(metric) => {
  const el = document.querySelector(`.panel[data-metric="${metric}"]`);
  return el && el.dataset.points ? JSON.parse(el.dataset.points) : null;
}"""


@pytest.fixture
def page(open_page: Any) -> Page:
    return open_page()


def test_up_prints_the_dashboard_url(live_run: LiveRun) -> None:
    out = live_run.log_path.read_text(errors="replace")
    assert live_run.dashboard == f"{live_run.rest}/ui/runs/{live_run.run_id}/curves"
    assert f"dashboard {live_run.dashboard}" in out


def test_asks_for_the_token_and_refuses_a_wrong_one(open_page: Any, live_run: LiveRun) -> None:
    p = open_page(with_token=False)
    page = p.page
    page.goto(live_run.dashboard)
    page.wait_for_selector("#token-form")
    assert page.locator(".panel").count() == 0  # nothing shown before the token
    page.fill("#token", "not-the-token")
    page.click("#token-form button[type=submit]")
    page.wait_for_selector("#token-error:not([hidden])")
    assert "refused" in page.inner_text("#token-error").lower()
    assert page.locator("#token-form").is_visible()
    p.shot("token")
    # No data route was asked for without the right token: only the open /v1/session.
    data = [u for _, u in p.requests if "/v1/" in u and "/v1/session" not in u]
    assert data == []
    page.fill("#token", live_run.token)
    page.click("#token-form button[type=submit]")
    page.wait_for_selector('.panel[data-metric="reward_mean"]')
    assert page.evaluate("k => sessionStorage.getItem(k)", "mutualrl.see.token") == \
        live_run.token
    # A new page in the same tab session keeps the token: no second prompt.
    page.goto(live_run.url("/ui/"))
    page.wait_for_selector(f'#runs tr[data-run="{live_run.run_id}"]')
    assert page.locator("#token-form").count() == 0
    assert p.errors == []


def test_every_policys_curves_grow_while_the_run_trains(page: Page, live_run: LiveRun) -> None:
    pg = page.page
    pg.goto(live_run.dashboard)
    metrics = ["reward_mean", "pass_rate", "rescued_prompts", "heldout/mean"]
    # Every policy has reported a few rounds.
    pg.wait_for_function(
        """(policies) => {
          const el = document.querySelector('.panel[data-metric="reward_mean"]');
          if (!el || !el.dataset.points) return false;
          const n = JSON.parse(el.dataset.points);
          return policies.every((p) => n[p] >= 2);
        }""", arg=POLICIES, timeout=120_000)
    first = pg.evaluate(POINTS_JS, "reward_mean")
    # ... and more while we watch, without reloading (the page polls SEE).
    pg.wait_for_function(
        """([policies, first]) => {
          const el = document.querySelector('.panel[data-metric="reward_mean"]');
          const n = JSON.parse(el.dataset.points);
          return policies.every((p) => n[p] > first[p]);
        }""", arg=[POLICIES, first], timeout=120_000)
    later = pg.evaluate(POINTS_JS, "reward_mean")
    assert all(later[p] > first[p] for p in POLICIES)
    # Every panel has a line per policy; pass rate tracks train reward's rounds.
    for m in metrics[:2]:
        assert set(pg.evaluate(POINTS_JS, m)) == set(POLICIES)
    assert pg.locator('.panel[data-metric="reward_mean"] .u-legend .u-series').count() == \
        len(POLICIES) + 1
    # The rows drawn are SEE's: the page's count per policy is at most what SEE holds.
    rows = live_run.get(f"/v1/runs/{live_run.run_id}/metrics", limit=10_000)["rows"]
    held = {p: len({r["round"] for r in rows if r["policy_id"] == p and
                    "reward_mean" in r["values"]}) for p in POLICIES}
    assert all(0 < later[p] <= held[p] for p in POLICIES)
    # Held-out panels per skill appear once trainers evaluate (eval.every = 3).
    pg.wait_for_selector('.panel[data-metric="heldout/add"]', timeout=120_000)
    # The page asks SEE for new rows about once a second (a new round shows within ~1 s).
    def polls() -> list[float]:
        return [t for t, u in page.requests if f"/v1/runs/{live_run.run_id}/metrics" in u]

    deadline = time.monotonic() + 60
    while len(polls()) < 6 and time.monotonic() < deadline:
        pg.wait_for_timeout(250)
    gaps = [b - a for a, b in itertools.pairwise(polls())]
    assert len(gaps) >= 5 and statistics.median(gaps) < 2.0, gaps
    page.shot("curves")
    assert page.errors == []


def _stop_trainers(run: LiveRun) -> None:
    """SIGTERM the trainers (each finishes its round, checkpoints and exits); SEE stays up."""
    pids = [pid for name, pid in run.state["pids"].items() if name.startswith("trainer-")]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if not any(_alive(pid) for pid in pids):
            return
        time.sleep(0.5)
    pytest.fail("trainers did not stop within 120 s of SIGTERM")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def test_heatmap_cells_equal_getrunstats(page: Page, live_run: LiveRun) -> None:
    from mutualrl.client.see import ClientOptions, SeeClient
    from mutualrl.v1 import experience_pb2 as pb

    _stop_trainers(live_run)  # transfers stop changing: the page and GetRunStats must agree
    with SeeClient(ClientOptions(address=live_run.see_grpc, token=live_run.token)) as see:
        stats = see.run_stats(live_run.run_id)
    names = {v: k for k, v in pb.RecordKind.items()}
    want = {(t.kind and names[t.kind], t.taker_policy, t.source_policy): t.count
            for t in stats.transfers}
    assert sum(want.values()) > 0
    pg = page.page
    pg.goto(live_run.url(f"/ui/runs/{live_run.run_id}/transfers"))
    pg.wait_for_selector(".heat-grid[data-loaded] td.cell")
    cells = pg.eval_on_selector_all(
        "td.cell", "els => els.map(e => [e.dataset.kind, e.dataset.taker, e.dataset.source, "
                   "Number(e.dataset.count), e.textContent])")
    kinds = ["VERIFIED_SUCCESS", "REWARD_STATS", "ROLLOUT"]
    # Every (kind, taker, source) with taker != source has a cell, and each equals GetRunStats.
    assert len(cells) == len(kinds) * len(POLICIES) * (len(POLICIES) - 1)
    got = {(k, t, s): n for k, t, s, n, _ in cells}
    for key, n in got.items():
        assert n == want.get(key, 0), key
    assert {k for k, v in want.items() if v} <= set(got)
    assert all(text.replace(",", "") == str(n) for _, _, _, n, text in cells)
    # A round window: the cells are the records of those rounds (the REST window they show).
    last = live_run.get(f"/v1/runs/{live_run.run_id}/transfers")["last_round"]
    pg.fill("#round-min", "0")
    pg.fill("#round-max", str(last // 2))
    pg.wait_for_selector(f'.heat-grid[data-window="0:{last // 2}"] td.cell')
    window = live_run.get(f"/v1/runs/{live_run.run_id}/transfers", round_min=0,
                          round_max=last // 2)["matrix"]
    part = pg.eval_on_selector_all(
        "td.cell", "els => els.map(e => [e.dataset.kind, e.dataset.taker, e.dataset.source, "
                   "Number(e.dataset.count)])")
    for k, t, s, n in part:
        assert n == window.get(k, {}).get(t, {}).get(s, 0)
        assert n <= got[(k, t, s)]
    pg.click("#all-rounds")
    pg.wait_for_selector('.heat-grid[data-window=":"] td.cell')
    page.shot("transfers")
    assert page.errors == []


def _check_record(page: Page, run: LiveRun, policy: str) -> None:
    pg = page.page
    pg.goto(run.url(f"/ui/runs/{run.run_id}/records?kind=ROLLOUT&policy={policy}&round_min=1"))
    pg.wait_for_selector(f'#records tr[data-record^="{policy}/"]')
    others = [p for p in POLICIES if p != policy]
    pg.wait_for_function("n => document.querySelectorAll('#detail .chunks').length === n",
                         arg=len(others))
    record_id = pg.get_attribute("#detail .rec-head", "data-record")
    assert record_id is not None and record_id.startswith(f"{policy}/")
    rec = run.get(f"/v1/runs/{run.run_id}/records/{record_id}")
    text = rec["text"]
    assert text
    joined = """(sel) => [...document.querySelectorAll(sel)].map(e => e.textContent).join('')"""
    # The sender's tokens, as the record carries them, tile the text.
    assert pg.evaluate(joined, "#detail .tokens.sender .piece") == text
    # Every token is drawn: a box, or a mark where it covers no text of its own (special).
    assert pg.locator("#detail .tokens.sender .tok, #detail .tokens.sender .mark").count() == \
        rec["num_tokens"]
    # Beside the sender's rendering of the problem, each other policy's own rendering.
    shown = pg.eval_on_selector_all("#detail .prompt[data-rendering]",
                                    "els => els.map(e => e.dataset.rendering)")
    assert sorted(shown) == sorted(others)
    align = run.get(f"/v1/runs/{run.run_id}/alignment", record_id=record_id)
    for recv in align["receivers"]:
        sel = f'#detail .chunks[data-receiver="{recv["policy_id"]}"]'
        # THL's chunks concatenate to the text on both sides (sender above, receiver below).
        assert pg.evaluate(joined, f"{sel} .chunk .src .piece") == text
        assert pg.evaluate(joined, f"{sel} .chunk .dst .piece") == text
        assert pg.locator(f"{sel} .chunk").count() == len(recv["chunks"]) > 0
        # Each chunk's log-prob sum is shown, and the sums add up to the sender's total.
        lps = pg.eval_on_selector_all(f"{sel} .chunk", "els => els.map(e => Number(e.dataset.lp))")
        assert sum(lps) == pytest.approx(sum(rec["logprobs"]), abs=1e-3)
        assert pg.locator(f"{sel} .chunk .lp").first.inner_text() != ""


def test_record_browser_chunks_concatenate_to_the_text(page: Page, live_run: LiveRun) -> None:
    for sender in ("gpt2-bpe", "llama-char", "qwen2-unigram"):  # byte BPE, chars, Unigram
        _check_record(page, live_run, sender)
    page.shot("records")
    assert page.errors == []


def test_probe_diagnostics(page: Page, live_run: LiveRun) -> None:
    pg = page.page
    pg.goto(live_run.url(f"/ui/runs/{live_run.run_id}/diagnostics"))
    pg.wait_for_selector("#thl-residual td.cell")
    shares = pg.eval_on_selector_all("#thl-residual td.cell[data-share]",
                                     "els => els.map(e => Number(e.dataset.share))")
    assert len(shares) == len(POLICIES) * (len(POLICIES) - 1)
    assert all(0.0 <= s <= 1.0 for s in shares) and max(shares) > 0.0
    # PRP's importance weights: a histogram per receiving policy, counts equal to its rows'.
    pg.wait_for_selector("#prp-hist svg.hist rect")
    rows = live_run.get(f"/v1/runs/{live_run.run_id}/metrics", limit=10_000)["rows"]
    latest: dict[tuple[str, int], dict[str, float]] = {}
    for r in rows:
        latest[(r["policy_id"], r["round"])] = r["values"]
    for policy in POLICIES:
        want = sum(v for (p, _), vals in latest.items() if p == policy
                   for k, v in vals.items() if k.startswith("prp_w_loghist/"))
        shown = pg.get_attribute(f'#prp-hist [data-policy="{policy}"]', "data-weights")
        assert float(shown or 0) == want
    # SGT rescues per skill: one panel per policy (this run's probe is PRP: none rescued).
    assert pg.locator("#sgt-rescues .panel").count() == len(POLICIES)
    page.shot("diagnostics")
    assert page.errors == []


def test_unknown_run_id_gets_a_clear_page(page: Page, live_run: LiveRun) -> None:
    pg = page.page
    for bad in ("no-such-run", "bad%20id%3F"):
        pg.goto(live_run.url(f"/ui/runs/{bad}/curves"))
        pg.wait_for_selector("#run-missing")
        assert "not found" in pg.inner_text("#run-missing h1")
        body = pg.inner_text("body")
        assert "Traceback" not in body and "Internal Server Error" not in body
        pg.click("#run-missing a")
        pg.wait_for_selector(f'#runs tr[data-run="{live_run.run_id}"]')
    page.shot("unknown-run")
    # The only console messages are the browser's own notes of the 404/422 answers (422: the
    # REST schema's run id pattern refuses "bad id?").
    assert all(any(f"status of {c}" in e for c in (400, 404, 422)) for e in page.errors), \
        page.errors


def test_run_list(page: Page, live_run: LiveRun) -> None:
    pg = page.page
    pg.goto(live_run.url("/ui/"))
    row = pg.locator(f'#runs tr[data-run="{live_run.run_id}"]')
    row.wait_for()
    assert all(p in row.inner_text() for p in POLICIES)
    row.locator("a").click()
    pg.wait_for_selector("#policy-legend")
    assert pg.locator("#policy-legend .policy").count() == len(POLICIES)
    page.shot("runs")
    assert page.errors == []
