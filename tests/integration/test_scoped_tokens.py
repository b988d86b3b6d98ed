"""Scoped credentials (#14 item 13): tokens derived from the run's secret. A policy's token
publishes, fetches and acks only as that policy; the read token reads (gRPC reads and REST) but
writes nothing; the secret itself stays the admin credential."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from mutualrl.bench.testing.see import make_config, rollout
from mutualrl.client.mwra import AsyncMwraClient
from mutualrl.client.see import AsyncSeeClient
from mutualrl.client.thl import AsyncThlClient
from mutualrl.common.auth import Principal, Role, derive_token, identify
from mutualrl.common.channel import ClientOptions

SECRET = "run-secret-7c1"
DENIED = grpc.StatusCode.PERMISSION_DENIED


def test_derived_tokens_identify_their_scope_and_nothing_else() -> None:
    a = derive_token(SECRET, "policy:a")
    read = derive_token(SECRET, "read")
    assert a.startswith("policy.a.") and read.startswith("read.")
    assert identify(f"Bearer {SECRET}", SECRET) == Principal(Role.ADMIN)
    assert identify(f"Bearer {a}", SECRET) == Principal(Role.POLICY, "a")
    assert identify(f"Bearer {read}", SECRET) == Principal(Role.READ)
    dotted = derive_token(SECRET, "policy:team.b-2")
    assert identify(f"Bearer {dotted}", SECRET) == Principal(Role.POLICY, "team.b-2")
    # Another secret's tokens, a renamed policy, a truncated MAC, another scheme: nobody.
    assert identify(f"Bearer {derive_token('other', 'policy:a')}", SECRET) is None
    assert identify(f"Bearer {a.replace('policy.a.', 'policy.b.')}", SECRET) is None
    assert identify(f"Bearer {read[:-1]}", SECRET) is None
    assert identify(f"Basic {SECRET}", SECRET) is None
    assert identify(None, SECRET) is None
    with pytest.raises(ValueError):
        derive_token(SECRET, "policy:")


@pytest.fixture
async def see(redis_url: str) -> AsyncIterator[Any]:
    from mutualrl.see.server import start_see

    srv = await start_see(make_config(redis_url, auth_token=SECRET))
    yield srv
    await srv.stop(0)


def _see(srv: Any, token: str) -> AsyncSeeClient:
    return AsyncSeeClient(ClientOptions(address=srv.address, token=token, outage_budget=0,
                                        timeout=10))


async def _code(coro: Any) -> grpc.StatusCode:
    try:
        await coro
    except grpc.aio.AioRpcError as err:
        return err.code()
    return grpc.StatusCode.OK


async def test_policy_tokens_act_only_as_their_policy(see: Any, run_id: str) -> None:
    tok_a, tok_b = derive_token(SECRET, "policy:a"), derive_token(SECRET, "policy:b")
    async with _see(see, SECRET) as admin, _see(see, tok_a) as a, _see(see, tok_b) as b:
        await admin.create_run(run_id, ["a", "b"], 1.0)
        assert await _code(a.create_run(f"{run_id}x", ["a"], 1.0)) == DENIED
        # A publishes as A; not as B, not in a batch that carries one record of B.
        stored = await a.publish(run_id, [rollout("a", 0, "q0", 0)])
        assert stored.stored == 1
        assert await _code(a.publish(run_id, [rollout("b", 0, "q0", 0)])) == DENIED
        assert await _code(a.publish(run_id, [rollout("a", 0, "q1", 0),
                                              rollout("b", 0, "q1", 0)])) == DENIED
        await b.publish(run_id, [rollout("b", 0, "q0", 0)])
        # A fetches B's rollouts as A; B may neither fetch as A nor ack A's deliveries.
        assert await _code(b.fetch_rollouts(run_id, "a", "c0")) == DENIED
        got = await a.fetch_rollouts(run_id, "a", "c0")
        ids = [d.delivery_id for d in got.deliveries]
        assert [d.record.policy_id for d in got.deliveries] == ["b"]
        assert await _code(b.ack(run_id, "a", ids)) == DENIED
        assert await _code(a.round_stats(run_id, 0, ["q0"], policy_id="b")) == DENIED
        assert await a.ack(run_id, "a", ids) == 1
        # Reads are open to every valid token.
        assert (await a.get_run(run_id)).config.run_id == run_id
        assert await _code(a.delete_run(run_id)) == DENIED
        forged = _see(see, tok_a.replace("policy.a.", "policy.b."))
        async with forged:
            assert await _code(forged.publish(run_id, [rollout("b", 0, "q2", 0)])) == \
                grpc.StatusCode.UNAUTHENTICATED


async def test_read_token_reads_and_writes_nothing(see: Any, run_id: str) -> None:
    read = derive_token(SECRET, "read")
    async with _see(see, SECRET) as admin, _see(see, read) as reader:
        await admin.create_run(run_id, ["a", "b"], 1.0)
        await admin.publish(run_id, [rollout("a", 0, "q0", 0)])
        assert await _code(reader.publish(run_id, [rollout("a", 0, "q0", 1)])) == DENIED
        assert await _code(reader.fetch_rollouts(run_id, "b", "c0")) == DENIED
        assert await _code(reader.ack(run_id, "b", ["1-1"])) == DENIED
        assert await _code(reader.create_run(f"{run_id}x", ["a"], 1.0)) == DENIED
        assert run_id in [r.config.run_id for r in await reader.list_runs()]
        stats = await reader.run_stats(run_id)
        assert stats.run_id == run_id

    def get(token: str | None) -> int:
        req = urllib.request.Request(f"{see.rest_url}/v1/runs/{run_id}")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as err:
            return int(err.code)

    codes = await asyncio.to_thread(lambda: [get(t) for t in (
        read, SECRET, derive_token(SECRET, "policy:a"), None, "read.0000")])
    assert codes == [200, 200, 403, 401, 401]


async def test_thl_and_mwra_honour_the_same_scopes(redis_url: str, run_id: str) -> None:
    from mutualrl.mwra.config import MwraConfig
    from mutualrl.mwra.server import start_mwra
    from mutualrl.thl.config import ThlConfig
    from mutualrl.thl.server import start_thl

    common = {"port": 0, "metrics_port": None, "redis_url": redis_url, "key_prefix": run_id,
              "auth_token": SECRET}
    thl = await start_thl(ThlConfig.model_validate(common))
    mwra = await start_mwra(MwraConfig.model_validate(common))
    read, tok_a = derive_token(SECRET, "read"), derive_token(SECRET, "policy:a")
    try:
        async with AsyncThlClient(thl.address, token=read, outage_budget=0) as t:
            assert await t.list() == []
            assert await _code(t.register("x", "/nowhere")) == DENIED
        async with AsyncMwraClient(mwra.address, token=tok_a, outage_budget=0) as m:
            assert await _code(m.register_policy(run_id, "b")) == DENIED
            assert await _code(m.register_worker(run_id, "w0", cpu_slots=1)) == DENIED
            info = await m.register_policy(run_id, "a")
            assert info.policy_id == "a"
        async with AsyncMwraClient(mwra.address, token=read, outage_budget=0) as m:
            assert await _code(m.register_policy(run_id, "a")) == DENIED
            table = await m.list_allocations(run_id)
            assert table is not None
    finally:
        await thl.stop(0)
        await mwra.stop(0)


async def test_policy_token_registers_only_its_own_tokenizer(redis_url: str, run_id: str) -> None:
    """A trainer holding policy A's token registers `<run>/A` for its run (what
    `PeerExchange.join` does), never another policy's id, another run's, or a free-form id."""
    import tempfile

    from mutualrl.bench.testing.thl import trained_tokenizers
    from mutualrl.thl.config import ThlConfig
    from mutualrl.thl.server import start_thl

    paths = trained_tokenizers()
    thl = await start_thl(ThlConfig(port=0, metrics_port=None, redis_url=redis_url,
                                    key_prefix=run_id, auth_token=SECRET,
                                    tokenizer_roots=[tempfile.gettempdir()]))
    tok_a = derive_token(SECRET, "policy:a")
    try:
        async with AsyncThlClient(thl.address, token=tok_a, outage_budget=0) as a:
            info = await a.register(f"{run_id}/a", paths["char"], overwrite=True, run_id=run_id)
            assert info.tokenizer_id == f"{run_id}/a"
            for tid, run in ((f"{run_id}/b", run_id),  # another policy of the run
                             (f"{run_id}/a", "other-run"),  # its id under another run's name
                             ("other-run/a", ""),  # no run: would outlive every run
                             (f"{run_id}/a/x", run_id), ("a", run_id)):
                try:
                    await a.register(tid, paths["char"], overwrite=True, run_id=run)
                except grpc.aio.AioRpcError as err:
                    assert err.code() == DENIED, (tid, run)
                    assert "policy 'a'" in (err.details() or ""), err.details()
                else:
                    raise AssertionError(f"{tid} for run {run!r} was registered")
            assert [t.tokenizer_id for t in await a.list()] == [f"{run_id}/a"]
        async with AsyncThlClient(thl.address, token=SECRET, outage_budget=0) as admin:
            b = await admin.register(f"{run_id}/b", paths["char"], run_id=run_id)
            assert b.tokenizer_id == f"{run_id}/b"
    finally:
        await thl.stop(0)
