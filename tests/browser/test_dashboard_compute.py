"""The dashboard's compute section: MWRA's threads and rollout workers per policy and the
rollout / update overlap, from the metric rows trainers report (a real SEE on port 0 with its
REST app, real Redis, rows sent through the SEE client as a trainer sends them; Chromium)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from service_loop import see_server

from mutualrl.client.see import SeeClient, metric_row

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def see(redis_url: str) -> Iterator[tuple[str, str]]:
    with see_server(redis_url, "dc", rest=True) as server:
        assert server.rest_url is not None
        yield server.address, server.rest_url


def test_threads_rollout_workers_and_overlap_per_policy(see: tuple[str, str],
                                                        browser: Any) -> None:
    grpc_address, rest = see
    run_id = f"dc-{uuid.uuid4().hex[:6]}"
    with SeeClient(grpc_address) as client:
        client.create_run(run_id, ["smol", "llama"])
        client.report_metrics(run_id, [
            # round 0: everyone in-process on one thread
            metric_row("smol", 0, {"threads": 1, "rollout_s": 6.0, "update_s": 40.0,
                                   "step_s": 47.0, "cost_s": 47.0}),
            metric_row("llama", 0, {"threads": 1, "rollout_s": 1.0, "update_s": 2.0,
                                    "step_s": 47.0, "cost_s": 3.5}),
            # round 1: smol holds both threads, one of them its rollout worker's; the rollouts
            # of its next round ran beside its update (3 + 2.5 s in a 4 s round)
            # (a worker's row: `rollout_s` the learner's wait, `generate_s` the sampling)
            metric_row("smol", 1, {"threads": 2, "rollout_workers": 1, "rollout_threads": 1,
                                   "rollout_s": 0.01, "generate_s": 3.0, "update_s": 2.5,
                                   "step_s": 4.0,
                                   "cost_s": 4.0}),
            metric_row("llama", 1, {"threads": 1, "rollout_s": 1.0, "update_s": 2.0,
                                    "step_s": 4.0, "cost_s": 3.5}),
        ])
    context = browser.new_context(viewport={"width": 1440, "height": 1000})
    errors: list[str] = []
    try:
        page = context.new_page()
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{rest}/ui/runs/{run_id}/curves")
        page.wait_for_function("""() => {
          const c = document.querySelector(
            '#mwra-plan tr[data-policy="smol"] td[data-col="round"]');
          return c && c.textContent === "1";
        }""", timeout=30_000)

        def row(policy: str) -> dict[str, str]:
            cells = page.locator(f'#mwra-plan tr[data-policy="{policy}"] td[data-col]')
            return {cells.nth(i).get_attribute("data-col") or "": cells.nth(i).inner_text()
                    for i in range(cells.count())}

        assert row("smol") == {"round": "1", "threads": "2", "rollout workers": "1",
                               "rollout threads": "1", "learner threads": "1",
                               "rollout s": "3", "update s": "2.50", "overlap s": "1.50",
                               "round s": "4"}
        assert row("llama") == {"round": "1", "threads": "1", "rollout workers": "0",
                                "rollout threads": "0", "learner threads": "1",
                                "rollout s": "1", "update s": "2", "overlap s": "0",
                                "round s": "4"}
        # a curve per policy in each compute panel
        for metric in ("threads", "rollout_workers", "rollout_s", "update_s", "overlap_s"):
            series = page.locator(f'.panel[data-metric="{metric}"] .u-legend .u-series')
            assert series.count() == 3, metric  # the x axis and the two policies
        assert errors == []
        if shots := os.environ.get("MUTUALRL_SCREENSHOTS"):
            page.screenshot(path=f"{shots}/dashboard-compute.png", full_page=True)
    finally:
        context.close()
