"""#14 item 7: long FetchRollouts waits succeed, and blocked fetches never starve Publish."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from mutualrl.bench.testing.see import make_config, rollout, running_see
from mutualrl.client.see import AsyncSeeClient, ClientOptions


@pytest.fixture
async def see(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.delenv("MUTUALRL_AUTH_TOKEN", raising=False)
    cfg = make_config(redis_url, redis_max_connections=4, redis_max_blocking_reads=3)
    async with running_see(cfg) as s:
        yield s


async def test_a_wait_longer_than_the_socket_timeout_succeeds(see: Any, run_id: str) -> None:
    """The pool's socket timeout was 5 s: block_ms=6000 failed UNAVAILABLE."""
    async with AsyncSeeClient(ClientOptions(address=see.address, timeout=30)) as c:
        await c.create_run(run_id, ["a", "b"])
        t0 = time.monotonic()
        got = await c.fetch_rollouts(run_id, "b", "w0", max_records=4, block_ms=6000)
        waited = time.monotonic() - t0
        assert got.deliveries == [] or len(got.deliveries) == 0
        assert 5.5 < waited < 12, waited


async def test_blocked_fetches_are_bounded_and_never_starve_publish(see: Any,
                                                                    run_id: str) -> None:
    async with AsyncSeeClient(ClientOptions(address=see.address, timeout=30,
                                            outage_budget=0)) as c:
        await c.create_run(run_id, ["a", "b"])

        async def fetch(i: int) -> Any:
            try:
                return await c.fetch_rollouts(run_id, "b", f"w{i}", max_records=64,
                                              block_ms=3000)
            except grpc.RpcError as err:
                return err

        # More would-be waiters than the pool has connections (4) and blocking slots (3).
        waiters = [asyncio.create_task(fetch(i)) for i in range(6)]
        await asyncio.sleep(0.5)
        t0 = time.monotonic()
        resp = await c.publish(run_id, [rollout("a", 0, f"p{i}", 0) for i in range(8)])
        assert resp.stored == 8 and time.monotonic() - t0 < 2.0
        results = await asyncio.gather(*waiters)
    refused = [r for r in results if isinstance(r, grpc.RpcError)]
    assert len(refused) == 3, [e.details() for e in refused]
    for err in refused:
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "block_ms" in err.details() and "3 blocking reads" in err.details()
    delivered = sum(len(r.deliveries) for r in results if not isinstance(r, grpc.RpcError))
    assert delivered == 8  # the waiting consumers woke up with the records
