"""The SDK rides out a service's outage: every client (SEE, THL, MWRA; blocking and asyncio)
retries UNAVAILABLE with backoff for as long as the outage budget, whatever the call's deadline,
then names the budget in the error; a Publish retried after its answer was lost stores nothing
twice; streams re-open where they left off. Real servers on 127.0.0.1, restarted on the same
port; a TCP proxy stands between client and SEE where an answer must get lost."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest

from mutualrl.bench.testing.see import make_config, rollout, running_see
from mutualrl.client.mwra import AsyncMwraClient, MwraClient
from mutualrl.client.see import AsyncSeeClient, SeeClient
from mutualrl.client.thl import AsyncThlClient, ThlClient
from mutualrl.common.channel import DEFAULT_OUTAGE_BUDGET, ClientOptions, Outage
from mutualrl.mwra.config import MwraConfig
from mutualrl.mwra.server import start_mwra
from mutualrl.see.server import start_see
from mutualrl.thl.config import ThlConfig
from mutualrl.thl.server import start_thl
from mutualrl.v1 import experience_pb2 as pb

DOWN_S = 3.0
"""How long a service stays away in these tests: longer than a call's deadline (2 s) and
than gRPC's own retry policy could cover (five attempts, ~1.5 s of backoff)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_budget_outlasts_a_restart_and_backs_off_to_its_cap() -> None:
    assert DEFAULT_OUTAGE_BUDGET >= 30 and ClientOptions().outage_budget == DEFAULT_OUTAGE_BUDGET
    opts = ClientOptions(outage_budget=10, backoff_base=0.1, backoff_max=1.0)
    outage = Outage(opts)
    delays = [outage.retry_in(grpc.StatusCode.UNAVAILABLE) for _ in range(8)]
    assert all(d is not None for d in delays)
    assert 0.075 <= delays[0] <= 0.125 and all(d <= 1.25 for d in delays)  # type: ignore[operator]
    assert delays[-1] >= 0.75  # type: ignore[operator]
    # Only UNAVAILABLE is an outage: a refusal or a deadline is the caller's answer.
    for code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.DEADLINE_EXCEEDED,
                 grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND):
        assert Outage(opts).retry_in(code) is None
    assert Outage(opts.model_copy(update={"outage_budget": 0})).retry_in(
        grpc.StatusCode.UNAVAILABLE) is None
    # gRPC's own reconnect delay is capped like the retries', or a service that came back
    # would go unseen by the channel for up to two minutes.
    assert ("grpc.max_reconnect_backoff_ms", 1000) in opts.channel_options()
    assert not any(k == "grpc.service_config" for k, _ in opts.channel_options())


def test_a_dead_address_is_retried_for_the_budget_not_the_deadline() -> None:
    """Nothing listens: a 0.2 s deadline does not end the call; the 1.5 s budget does, and
    the error says so. With no budget the call fails at once."""
    opts = ClientOptions(address=f"127.0.0.1:{_free_port()}", timeout=0.2, outage_budget=1.5,
                         backoff_max=0.5)
    with SeeClient(opts) as client:
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            client.list_runs()
        elapsed = time.monotonic() - start
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "outage budget is 1.5 s" in err.value.details()
        assert 1.5 <= elapsed < 3.5, elapsed
        assert client.outages.down_since is not None  # never answered: still down
    with SeeClient(opts.model_copy(update={"outage_budget": 0})) as client:
        start = time.monotonic()
        with pytest.raises(grpc.RpcError):
            client.list_runs()
        assert time.monotonic() - start < 1.0


Server = Any
Start = Callable[[int], Awaitable[Server]]


def _see(redis_url: str) -> Start:
    async def start(port: int) -> Server:
        return await start_see(make_config(redis_url, port=port, rest_port=None))
    return start


def _thl(redis_url: str) -> Start:
    async def start(port: int) -> Server:
        return await start_thl(ThlConfig(port=port, metrics_port=None, redis_url=redis_url,
                                         tokenizer_roots=["/"]))
    return start


def _mwra(redis_url: str) -> Start:
    async def start(port: int) -> Server:
        return await start_mwra(MwraConfig(port=port, metrics_port=None, redis_url=redis_url,
                                           tick_seconds=0.05, lock_ttl_seconds=1.0))
    return start


async def _stop(server: Server) -> None:
    await server.stop(0)


async def _restarted(start: Start, port: int, call: Callable[[], Awaitable[Any]]) -> Any:
    """Start the service on `port`, answer `call` once, stop it, start `call` again, bring
    the service back after DOWN_S; returns (the answer, seconds the call took)."""
    server = await start(port)
    await call()
    await _stop(server)
    t0 = time.monotonic()
    pending = asyncio.ensure_future(call())
    await asyncio.sleep(DOWN_S)
    assert not pending.done(), "the call ended while its service was away"
    server = await start(port)
    try:
        answer = await asyncio.wait_for(pending, 30)
    finally:
        await _stop(server)
    return answer, time.monotonic() - t0


def _calls(kind: str, run_id: str) -> tuple[Callable[[Any], Awaitable[Any]],
                                             Callable[[Any], Any]]:
    """(an asyncio call, its blocking twin) of one client kind, each a cheap read or write."""
    if kind == "see":
        return (lambda c: c.create_run(run_id, ["a", "b"], exist_ok=True),
                lambda c: c.create_run(run_id, ["a", "b"], exist_ok=True))
    if kind == "thl":  # a read: a registration's first tokenizer load is not what is timed
        return (lambda c: c.list(), lambda c: c.list())
    return (lambda c: c.register_policy(run_id, "a"), lambda c: c.register_policy(run_id, "a"))


CLIENTS = {"see": (SeeClient, AsyncSeeClient, _see), "thl": (ThlClient, AsyncThlClient, _thl),
           "mwra": (MwraClient, AsyncMwraClient, _mwra)}


@pytest.mark.parametrize("kind", list(CLIENTS))
@pytest.mark.parametrize("blocking", [False, True], ids=["asyncio", "blocking"])
async def test_every_client_rides_out_a_restart_longer_than_its_deadline(
        kind: str, blocking: bool, redis_url: str, run_id: str) -> None:
    sync_cls, async_cls, starter = CLIENTS[kind]
    port = _free_port()
    opts = ClientOptions(address=f"127.0.0.1:{port}", timeout=2.0, outage_budget=30,
                         backoff_max=0.5)
    acall, scall = _calls(kind, run_id)
    if blocking:
        client = sync_cls(opts)

        def call() -> Awaitable[Any]:
            return asyncio.to_thread(scall, client)
    else:
        client = async_cls(opts)

        def call() -> Awaitable[Any]:
            return acall(client)
    try:
        answer, took = await _restarted(starter(redis_url), port, call)
    finally:
        if blocking:
            client.close()
        else:
            await client.close()
    assert answer is not None and took >= DOWN_S
    # Found again within the backoff cap of its return (plus a loaded machine's slack).
    assert took < DOWN_S + 5.0, took
    assert len(client.outages.outages) == 1 and client.outages.outages[0] >= DOWN_S


class LosingProxy:
    """A TCP proxy to `target` that can lose answers: while `holding`, nothing the server
    sends reaches the client; `cut()` then closes every connection, so the call whose answer
    was held fails with UNAVAILABLE after the server did its work."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.holding = False
        self._open: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection("127.0.0.1", self.target)
        self._open += [cw, sw]

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, answers: bool) -> None:
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                while data := await r.read(65536):
                    if answers and self.holding:
                        continue  # the answer is lost on the way
                    w.write(data)
                    await w.drain()
            w.close()

        await asyncio.gather(pipe(cr, sw, False), pipe(sr, cw, True))

    def cut(self) -> None:
        for w in self._open:
            w.close()
        self._open.clear()

    async def close(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()


async def test_a_publish_whose_answer_was_lost_is_stored_once(redis_url: str,
                                                              run_id: str) -> None:
    async with running_see(make_config(redis_url, rest_port=None)) as see:
        proxy = LosingProxy(int(see.address.rsplit(":", 1)[1]))
        await proxy.start()
        direct = AsyncSeeClient(see.address)
        through = AsyncSeeClient(ClientOptions(address=f"127.0.0.1:{proxy.port}", timeout=5,
                                               outage_budget=20, backoff_max=0.5))
        try:
            await through.create_run(run_id, ["a", "b"])  # the connection is up
            records = [rollout("a", 0, f"p{i}", i) for i in range(8)]
            proxy.holding = True
            publish = asyncio.ensure_future(through.publish(run_id, records))
            deadline = time.monotonic() + 20
            stored = 0
            while time.monotonic() < deadline:  # SEE stored the batch; its answer is held
                stats = await direct.run_stats(run_id)
                stored = sum(p.published.get("ROLLOUT", 0) for p in stats.policies)
                if stored == len(records):
                    break
                await asyncio.sleep(0.05)
            assert stored == len(records) and not publish.done()
            proxy.holding = False
            proxy.cut()  # the answer is lost: the client retries on a new connection
            answer = await asyncio.wait_for(publish, 20)
            stats = await direct.run_stats(run_id)
        finally:
            await through.close()
            await direct.close()
            await proxy.close()
    assert (answer.stored, answer.duplicates) == (0, len(records))
    assert {r.status for r in answer.results} == {pb.PUBLISH_STATUS_DUPLICATE}
    assert stats.policies[0].published["ROLLOUT"] == len(records)
    assert through.outages.outages, "the lost answer did not count as an outage"


async def test_a_subscription_resumes_after_its_last_event_across_a_restart(
        redis_url: str, run_id: str) -> None:
    """SEE restarts between two events; what is published before the subscriber is back is
    still delivered, once, in order."""
    port = _free_port()
    start = _see(redis_url)
    server = await start(port)
    opts = ClientOptions(address=f"127.0.0.1:{port}", timeout=5, outage_budget=30,
                         backoff_max=1.0)
    got: list[str] = []
    async with AsyncSeeClient(opts) as c:
        await c.create_run(run_id, ["a", "b"])

        async def read() -> None:
            async for event in c.subscribe(run_id, [pb.ROLLOUT]):
                got.append(event.record.record_id)
                if len(got) == 4:
                    return

        reader = asyncio.ensure_future(read())
        await asyncio.sleep(0.5)
        await c.publish(run_id, [rollout("a", 0, f"p{i}", i) for i in range(2)])
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert len(got) == 2
        await _stop(server)
        await asyncio.sleep(1.0)
        server = await start(port)
        try:
            async with AsyncSeeClient(ClientOptions(address=f"127.0.0.1:{port}")) as other:
                await other.publish(run_id, [rollout("a", 1, f"p{i}", i) for i in range(2)])
            await asyncio.wait_for(reader, 20)
        finally:
            await _stop(server)
    assert got == ["a/0/p0/0", "a/0/p1/1", "a/1/p0/0", "a/1/p1/1"]


@contextlib.asynccontextmanager
async def _serving(start: Start, port: int) -> AsyncIterator[Server]:
    server = await start(port)
    try:
        yield server
    finally:
        await _stop(server)


async def test_an_allocation_watch_reopens_across_a_restart(redis_url: str,
                                                            run_id: str) -> None:
    port = _free_port()
    start = _mwra(redis_url)
    opts = ClientOptions(address=f"127.0.0.1:{port}", timeout=5, outage_budget=30,
                         backoff_max=0.5)
    async with AsyncMwraClient(opts) as c:
        async with _serving(start, port):
            await c.register_worker(run_id, "w", cpu_slots=2)
            await c.register_policy(run_id, "p")
            await c.get_allocation(run_id, "p", 0)
            watch = c.watch_allocation(run_id, "p")
            first = await anext(watch)
        nxt = asyncio.ensure_future(anext(watch))
        await asyncio.sleep(1.0)
        assert not nxt.done()
        async with _serving(start, port):
            again = await asyncio.wait_for(nxt, 20)  # the current allocation, from Redis
        await watch.aclose()  # type: ignore[attr-defined]
    assert (again.policy_id, again.round, again.units) == (first.policy_id, first.round,
                                                           first.units)
