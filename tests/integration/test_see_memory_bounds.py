"""#14 item 12: SEE's memory is bounded whatever clients send: the run-config cache, the
Publish bytes worked on at once, and the size of one FetchRollouts answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from mutualrl.bench.testing.see import make_config, rollout, running_see
from mutualrl.client.see import AsyncSeeClient, ClientOptions


@pytest.fixture
async def see(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.delenv("MUTUALRL_AUTH_TOKEN", raising=False)
    cfg = make_config(redis_url, limits={"max_cached_runs": 8, "max_response_bytes": 20_000,
                                         "max_inflight_publish_bytes": 200_000})
    async with running_see(cfg) as s:
        yield s


@pytest.fixture
async def client(see: Any) -> AsyncIterator[AsyncSeeClient]:
    async with AsyncSeeClient(ClientOptions(address=see.address, outage_budget=0)) as c:
        yield c


async def test_run_cache_is_bounded(see: Any, client: AsyncSeeClient, run_id: str) -> None:
    """The run cache kept every run ever created or read: it grew without bound."""
    ids = [f"{run_id}-{i}" for i in range(30)]
    try:
        for rid in ids:
            await client.create_run(rid, ["a"])
            await client.fetch_rollouts(rid, "a", "w", max_records=1)  # reads the run
            assert see.store.runs.cached <= 8
        for i in range(200):  # unknown runs are never cached
            with pytest.raises(grpc.RpcError):
                await client.fetch_rollouts(f"{run_id}-missing-{i}", "a", "w")
        assert see.store.runs.cached <= 8
    finally:
        for rid in ids:
            await client.delete_run(rid)


async def test_publish_bytes_in_flight_are_bounded(see: Any, client: AsyncSeeClient,
                                                   run_id: str) -> None:
    await client.create_run(run_id, ["a", "b"])
    batch = [rollout("a", 0, f"p{i}", 0, n_tokens=300) for i in range(8)]  # ~40 kB
    budget = see.store.publish_bytes
    with budget.hold(190_000):  # as if other Publish calls were being worked on
        with pytest.raises(grpc.RpcError) as err:
            await client.publish(run_id, batch)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "records" in err.value.details() and "200000 B" in err.value.details()
    assert budget.in_use == 0
    assert (await client.publish(run_id, batch)).stored == 8
    assert budget.in_use == 0


async def test_one_fetch_answer_is_bounded(client: AsyncSeeClient, run_id: str) -> None:
    """max_records=4096 of 1 MB records would have built a 4 GB answer."""
    await client.create_run(run_id, ["a", "b"])
    recs = [rollout("a", 0, f"p{i}", 0, n_tokens=300) for i in range(10)]
    size = len(recs[0].SerializeToString())
    assert 4_000 < size < 8_000  # so at most 4 fit the 20 kB answer
    await client.publish(run_id, recs)
    seen: list[str] = []
    for k in range(5):
        got = await client.fetch_rollouts(run_id, "b", "w", max_records=4096)
        assert sum(d.record.ByteSize() for d in got.deliveries) <= 20_000 + 100 * len(
            got.deliveries)
        ids = [d.record.record_id for d in got.deliveries]
        if k == 0:
            assert 1 <= len(ids) <= 4, len(ids)
        seen += ids
        if ids:
            await client.ack(run_id, "b", [d.delivery_id for d in got.deliveries])
    assert sorted(seen) == sorted(r.record_id for r in recs)  # each once, none lost
