"""DeleteRun on SEE, THL and MWRA (real servers on port 0, real Redis): it removes exactly the
run's state, nothing of another run or another prefix, and answers NOT_FOUND / INVALID_ARGUMENT
sensibly."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import redis

from mutualrl.bench.testing.see import make_config, rollout, stats_record, success_record
from mutualrl.bench.testing.thl import trained_tokenizers
from mutualrl.client.mwra import AsyncMwraClient
from mutualrl.client.runs import delete_run
from mutualrl.client.see import AsyncSeeClient
from mutualrl.client.thl import AsyncThlClient
from mutualrl.mwra.config import MwraConfig
from mutualrl.mwra.server import MwraServer, start_mwra
from mutualrl.see.server import SeeServer, start_see
from mutualrl.thl.config import ThlConfig
from mutualrl.thl.server import ThlServer, start_thl

pytestmark = pytest.mark.timeout(120)


class Stack:
    def __init__(self, prefix: str, see: SeeServer, thl: ThlServer, mwra: MwraServer) -> None:
        self.prefix, self.see, self.thl, self.mwra = prefix, see, thl, mwra


async def _start(redis_url: str, prefix: str) -> Stack:
    common: dict[str, Any] = dict(port=0, metrics_port=None, auth_token=None,
                                  grace_seconds=0.2, key_prefix=prefix)
    see = await start_see(make_config(redis_url, rest_port=None, **common))
    thl = await start_thl(ThlConfig(redis_url=redis_url, tokenizer_roots=[tempfile.gettempdir()],
                                    **common))
    # Long leases: a lapse would add a `lost` key mid-test on a slow machine.
    mwra = await start_mwra(MwraConfig(redis_url=redis_url, lock_ttl_seconds=1.0,
                                       tick_seconds=0.05, worker_lease_seconds=120,
                                       policy_lease_seconds=120, **common))
    return Stack(prefix, see, thl, mwra)


@pytest.fixture
async def stacks(redis_url: str) -> AsyncIterator[tuple[Stack, Stack]]:
    """Two deployments sharing one Redis under different key prefixes."""
    tag = uuid.uuid4().hex[:8]
    a = await _start(redis_url, f"dra{tag}")
    b = await _start(redis_url, f"drb{tag}")
    yield a, b
    for s in (a, b):
        for server in (s.see, s.thl, s.mwra):
            await server.stop(0.2)
    r = redis.Redis.from_url(redis_url)
    for s in (a, b):
        keys = list(r.scan_iter(match=f"{s.prefix}:*", count=1000))
        if keys:
            r.delete(*keys)
    r.close()


async def _fill(s: Stack, run_id: str, paths: dict[str, str]) -> None:
    """Give the run state in all three services."""
    async with AsyncSeeClient(s.see.address) as see:
        await see.create_run(run_id, ["a", "b"], tau=1.0)
        await see.publish(run_id, [rollout("a", 0, "p0", i) for i in range(3)]
                          + [stats_record("a", 0, "p0", [1.0, 0.0]),
                             success_record("b", 0, "p0", "42")])
        await see.fetch_rollouts(run_id, "b", "b-trainer")
    async with AsyncThlClient(s.thl.address) as thl:
        await thl.register(f"{run_id}/a", paths["byte_bpe"], run_id=run_id)
    async with AsyncMwraClient(s.mwra.address) as mwra:
        await mwra.register_worker(run_id, "w0", cpu_slots=2)
        await mwra.register_policy(run_id, "a")
        await mwra.get_allocation(run_id, "a", 0)


def _keys(r: redis.Redis, pattern: str) -> set[str]:
    return {k.decode() for k in r.scan_iter(match=pattern, count=1000)}


async def test_delete_run_removes_exactly_that_run(stacks: tuple[Stack, Stack],
                                                  redis_url: str) -> None:
    a, b = stacks
    paths = trained_tokenizers()
    run, other = f"run-{uuid.uuid4().hex[:6]}", f"run-{uuid.uuid4().hex[:6]}"
    await _fill(a, run, paths)
    await _fill(a, other, paths)
    await _fill(b, run, paths)  # the same run id in another deployment
    r = redis.Redis.from_url(redis_url)
    try:
        before_a = _keys(r, f"{a.prefix}:*")
        before_b = _keys(r, f"{b.prefix}:*")
        mine = {k for k in before_a if f":{{{run}}}:" in k}
        assert {k.split(":")[1] for k in mine} == {"see", "mwra"}
        assert len(mine) > 10
        # Every run key follows the scheme <prefix>:<service>:{<run>}:<name>.
        assert all(k.startswith((f"{a.prefix}:see:{{{run}}}:", f"{a.prefix}:mwra:{{{run}}}:"))
                   for k in mine)
        async with AsyncThlClient(a.thl.address) as thl:
            assert f"{run}/a" in {t.tokenizer_id for t in await thl.list()}

        # The blocking helper runs in a thread: the servers share this test's event loop.
        addrs = dict(see=a.see.address, thl=a.thl.address, mwra=a.mwra.address)
        deleted = await asyncio.to_thread(delete_run, run, **addrs)
        see_keys = {k for k in mine if k.startswith(f"{a.prefix}:see:")}
        assert deleted["see"] == len(see_keys)
        # MWRA's leader loop may add its lock key after the snapshot: at least what was seen.
        assert deleted["mwra"] >= len(mine - see_keys)
        assert deleted["thl"] == 1
        await asyncio.sleep(0.3)  # several MWRA ticks: the deleted run's lock is not re-made
        after_a = _keys(r, f"{a.prefix}:*")
        assert not {k for k in after_a if f"{{{run}}}" in k}
        before_others = {k for k in before_a - mine if f"{{{other}}}" not in k}
        assert {k for k in after_a if f"{{{other}}}" not in k} == before_others  # indexes stay
        assert {k for k in after_a if f"{{{other}}}" in k} >= {  # the other run is untouched
            k for k in before_a if f"{{{other}}}" in k}
        assert _keys(r, f"{b.prefix}:*") >= before_b  # the other deployment is untouched
        assert run not in {m.decode() for m in r.smembers(f"{a.prefix}:see:runs")}
        async with AsyncThlClient(a.thl.address) as thl:
            ids = {t.tokenizer_id for t in await thl.list()}
            assert f"{run}/a" not in ids and f"{other}/a" in ids
        async with AsyncSeeClient(a.see.address, outage_budget=0) as see:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await see.get_run(run)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            assert (await see.get_run(other)).config.run_id == other

        # A second delete finds nothing: NOT_FOUND from each service, 0 from the helper.
        for client_cls, srv in ((AsyncSeeClient, a.see), (AsyncThlClient, a.thl),
                                (AsyncMwraClient, a.mwra)):
            async with client_cls(srv.address, outage_budget=0) as c:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await c.delete_run(run)
                assert err.value.code() == grpc.StatusCode.NOT_FOUND, client_cls
                assert "run_id" in (err.value.details() or "")
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await c.delete_run("bad run!")
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "run_id" in (err.value.details() or "")
        assert await asyncio.to_thread(delete_run, run, **addrs) == {
            "see": 0, "thl": 0, "mwra": 0}
    finally:
        r.close()


async def test_thl_keeps_a_registration_another_run_or_a_pin_holds(
        stacks: tuple[Stack, Stack]) -> None:
    a, _ = stacks
    paths = trained_tokenizers()
    r1, r2 = f"r1-{uuid.uuid4().hex[:6]}", f"r2-{uuid.uuid4().hex[:6]}"
    async with AsyncThlClient(a.thl.address, outage_budget=0) as thl:
        await thl.register("shared", paths["wordpiece"], run_id=r1)
        await thl.register("shared", paths["wordpiece"], run_id=r2)
        await thl.register("pinned", paths["unigram"])
        await thl.register("pinned", paths["unigram"], run_id=r1)
        assert await thl.delete_run(r1) == 2
        names = {t.tokenizer_id for t in await thl.list()}
        assert {"shared", "pinned"} <= names  # r2 still holds one, the other is pinned
        assert await thl.delete_run(r2) == 1
        names = {t.tokenizer_id for t in await thl.list()}
        assert "shared" not in names and "pinned" in names
        # The dropped registration is gone for alignment too.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await thl.retokenize("shared", ["x"])
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
