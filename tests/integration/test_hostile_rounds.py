"""Rounds a client names are held to the run's horizon and to 2^31 - 1, on every RPC that takes
one (SEE: Publish, FetchRollouts, GetRoundStats, GetVerifiedSuccesses, ReportMetrics; MWRA:
GetAllocation, ReportStepCost): a round 2^63 - 1 once pinned MWRA's plan for the run and made
SEE's /transfers report round 9223372036854775808. Also: a REST page of metric rows is bounded
by bytes (2,048 rows of 512 values once made a 130 MB page; 600 of them here), and a denial
quotes a bounded prefix of a 10 kB id (PERMISSION_DENIED, not RESOURCE_EXHAUSTED for an
oversized trailer)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest

from mutualrl.bench.testing.see import make_config, rollout, running_see, stats_record
from mutualrl.client.mwra import AsyncMwraClient
from mutualrl.client.see import AsyncSeeClient, ClientOptions, metric_row
from mutualrl.common.auth import derive_token
from mutualrl.common.bounds import MAX_ROUND
from mutualrl.mwra.config import MwraConfig
from mutualrl.mwra.server import start_mwra

pytestmark = pytest.mark.timeout(120)
AHEAD = 10
SECRET = "rounds-secret"
EXTREMES = (MAX_ROUND + 1, 2**53, 2**63 - 1, -1, -(2**63))


@pytest.fixture
async def see(redis_url: str) -> AsyncIterator[Any]:
    cfg = make_config(redis_url, auth_token=SECRET, limits={"max_round_ahead": AHEAD})
    async with running_see(cfg) as s:
        yield s


def _see_client(see: Any, token: str = SECRET) -> AsyncSeeClient:
    return AsyncSeeClient(ClientOptions(address=see.address, outage_budget=0, token=token))


async def _invalid(call: Any, field: str) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    details = err.value.details() or ""
    assert details.startswith(f"{field}:"), details
    return details


async def test_see_rounds_stay_within_the_horizon(see: Any, run_id: str) -> None:
    async with _see_client(see) as c:
        await c.create_run(run_id, ["a", "b"])
        # A run with no round yet takes its first anywhere up to 2^31 - 1.
        await c.publish(run_id, [stats_record("a", 500, "q", [0.0, 1.0])])
        for r in (*EXTREMES, 500 + AHEAD + 1):
            rec = stats_record("b", 500, "q2", [1.0])
            rec.round = r
            ok = stats_record("b", 500, "q", [1.0])
            await _invalid(c.publish(run_id, [ok, rec]), "records[1].round")
        await c.publish(run_id, [stats_record("b", 500 + AHEAD, "q", [1.0])])  # moves it on
        await c.publish(run_id, [stats_record("a", 500 + 2 * AHEAD, "q", [1.0])])
        current = 500 + 2 * AHEAD
        too_far = current + AHEAD + 1
        await _invalid(c.round_stats(run_id, too_far, ["q"]), "round")
        await _invalid(c.successes(run_id, "a", ["q"], min_round=too_far), "min_round")
        assert await c.successes(run_id, "a", ["q"], min_round=-(2**63)) == {"q": []}
        await _invalid(c.fetch_rollouts(run_id, "a", "w", current_round=too_far),
                       "current_round")
        await _invalid(c.fetch_rollouts(run_id, "a", "w", max_round_lag=2**63 - 1),
                       "max_round_lag")
        await _invalid(c.report_metrics(run_id, [metric_row("a", too_far, {"x": 1.0})]),
                       "rows[0].round")
        await _invalid(c.report_metrics(run_id, [metric_row("a", 0, {"x": 1.0},
                                                            unix_ms=2**63 - 1)]),
                       "rows[0].unix_ms")
        # Within it, all answer; a metric row moves the run's round on too.
        assert (await c.round_stats(run_id, current, ["q"])).prompts[0].pooled.count == 1
        await c.report_metrics(run_id, [metric_row("a", current + AHEAD, {"x": 1.0})])
        see.store.runs.forget(run_id)  # read the current round back from Redis
        await c.publish(run_id, [stats_record("b", current + 2 * AHEAD, "q", [1.0])])
        # The rounds a taker counts transfers under stay exact on REST.
        await c.round_stats(run_id, current, ["q"], policy_id="b")
        async with httpx.AsyncClient(base_url=see.rest_url,
                                     headers={"Authorization": f"Bearer {SECRET}"}) as h:
            t = (await h.get(f"/v1/runs/{run_id}/transfers")).json()
            assert (t["first_round"], t["last_round"]) == (current, current)
            bad = await h.get(f"/v1/runs/{run_id}/records", params={"round_max": 2**63 - 1})
            assert bad.status_code == 422


async def test_a_rest_page_of_metric_rows_is_bounded_by_bytes(redis_url: str,
                                                              run_id: str) -> None:
    budget = 1 << 20
    cfg = make_config(redis_url, limits={"max_response_bytes": budget,
                                         "max_record_bytes": 64 * 1024})
    async with running_see(cfg) as see, _see_client(see, token="") as c:
        await c.create_run(run_id, ["a"])
        values = {f"metric/{i:03d}/" + "n" * 80: float(i) for i in range(512)}
        rows = [metric_row("a", r, values) for r in range(600)]
        assert await c.report_metrics(run_id, rows) == 600
        async with httpx.AsyncClient(base_url=see.rest_url, timeout=60) as h:
            after, seen, pages = None, 0, 0
            while True:
                query: dict[str, Any] = {"limit": 10_000}
                if after:
                    query["after"] = after
                reply = await h.get(f"/v1/runs/{run_id}/metrics", params=query)
                assert reply.status_code == 200
                assert len(reply.content) <= budget, len(reply.content)
                page = reply.json()
                seen += len(page["rows"])
                pages += 1
                after = page["cursor"]
                if not page["more"]:
                    break
            assert seen == 600 and pages >= 20  # ~50 kB a row, ~20 rows a 1 MiB page
            runs = (await h.get("/v1/runs", params={"limit": 1})).json()
            assert len(runs["runs"]) == 1


async def test_a_denial_quotes_a_bounded_prefix_of_a_10_kb_id(see: Any, run_id: str) -> None:
    long_id = "p" * 10_000
    async with _see_client(see, token=derive_token(SECRET, "policy:a")) as c:
        for call in (c.fetch_rollouts(run_id, long_id, "w"),
                     c.publish(run_id, [rollout(long_id, 0, "q", 0)])):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
            details = err.value.details() or ""
            assert "(10000 characters)" in details and len(details) < 400, len(details)


@pytest.fixture
async def mwra(redis_url: str) -> AsyncIterator[Any]:
    srv = await start_mwra(MwraConfig.model_validate({
        "port": 0, "metrics_port": None, "redis_url": redis_url, "tick_seconds": 0.05,
        "lock_ttl_seconds": 1.0, "max_round_ahead": AHEAD, "max_workers": 3,
        "max_policies": 2, "auth_token": SECRET}))
    yield srv
    await srv.stop(0)


async def test_mwra_rounds_stay_within_the_horizon(mwra: Any, run_id: str) -> None:
    async with AsyncMwraClient(ClientOptions(address=mwra.address, outage_budget=0,
                                             token=SECRET)) as c:
        await c.register_worker(run_id, "w0", cpu_slots=4)
        await c.register_policy(run_id, "a")
        for r in EXTREMES:
            await _invalid(c.get_allocation(run_id, "a", r), "round")
            await _invalid(c.report_step_cost(run_id, "a", r, 1.0), "round")
        first = await c.get_allocation(run_id, "a", 1)
        assert first.round == 1
        await _invalid(c.get_allocation(run_id, "a", 1 + AHEAD + 1), "round")
        await _invalid(c.report_step_cost(run_id, "a", 1 + AHEAD + 1, 1.0), "round")
        # The plan was not pinned: round 1 is still round 1, and the run moves on in steps.
        assert (await c.get_allocation(run_id, "a", 1)).round == 1
        assert (await c.get_allocation(run_id, "a", 1 + AHEAD)).round == 1 + AHEAD
        await c.report_step_cost(run_id, "a", 1 + 2 * AHEAD, 1.0, tokens=2**53 - 1)
        await _invalid(c.report_step_cost(run_id, "a", 2, 1.0, tokens=2**63 - 1), "tokens")
        # What a run holds is bounded: a fourth worker, a third policy are refused.
        for w in ("w1", "w2"):
            await c.register_worker(run_id, w, cpu_slots=1)
        await c.register_worker(run_id, "w0", cpu_slots=2)  # re-registering is no new one
        await c.register_policy(run_id, "b")
        for call, field in ((c.register_worker(run_id, "w3", cpu_slots=1), "worker.worker_id"),
                            (c.register_policy(run_id, "c"), "policy_id")):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert (err.value.details() or "").startswith(f"{field}:")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.register_worker(run_id, "w1", cpu_slots=1, labels={f"k{i}": "é" * 1000
                                                          for i in range(8)})
        assert (err.value.details() or "").startswith("worker.labels:")
    # A policy's token denied on another policy's 10 kB id: a bounded PERMISSION_DENIED.
    async with AsyncMwraClient(ClientOptions(address=mwra.address, outage_budget=0,
                                             token=derive_token(SECRET, "policy:a"))) as c:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.deregister_policy(run_id, "x" * 10_000)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert len(err.value.details() or "") < 400
