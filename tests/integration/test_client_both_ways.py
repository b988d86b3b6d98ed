"""Each client method is written once (the asyncio client) and its blocking twin is a facade:
the facade has every method with the same parameters, and the same calls against real SEE,
THL and MWRA servers give the same answers both ways."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from mutualrl.bench.testing.see import make_config, rollout, running_see
from mutualrl.bench.testing.thl import trained_tokenizers
from mutualrl.client.base import AsyncClient, Client
from mutualrl.client.mwra import AsyncMwraClient, MwraClient
from mutualrl.client.see import AsyncSeeClient, SeeClient
from mutualrl.client.thl import AsyncThlClient, ThlClient
from mutualrl.common.alignment_types import TraceItem
from mutualrl.mwra.config import MwraConfig
from mutualrl.mwra.server import start_mwra
from mutualrl.thl.config import ThlConfig
from mutualrl.thl.server import start_thl
from mutualrl.v1 import experience_pb2 as pb

PAIRS: list[tuple[type[Client[Any]], type[AsyncClient]]] = [
    (SeeClient, AsyncSeeClient), (ThlClient, AsyncThlClient), (MwraClient, AsyncMwraClient)]


def _public(cls: type) -> dict[str, Any]:
    return {n: f for n, f in inspect.getmembers(cls, inspect.isfunction)
            if not n.startswith("_") and n != "close"}


@pytest.mark.parametrize(("sync", "core"), PAIRS)
def test_the_facade_has_every_method_with_the_same_parameters(
        sync: type[Client[Any]], core: type[AsyncClient]) -> None:
    methods = _public(core)
    facade = _public(sync)
    assert set(facade) == set(methods)
    for name, method in methods.items():
        assert inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method), name
        assert not inspect.iscoroutinefunction(facade[name]), name
        ours = list(inspect.signature(facade[name]).parameters)
        if name in ("keepalive", "policy_keepalive"):  # the facade hands back a handle
            assert ours == list(inspect.signature(method).parameters)[:-1], name
            continue
        assert ours == list(inspect.signature(method).parameters), name
        assert facade[name].__doc__ == method.__doc__, name


Step = tuple[str, tuple[Any, ...], dict[str, Any], Callable[[Any], Any]]


async def _both(make_sync: Callable[[], Client[Any]], make_async: Callable[[], AsyncClient],
                steps: Callable[[str], list[Step]], run_a: str, run_b: str
                ) -> tuple[list[Any], list[Any]]:
    """The same steps through the asyncio client (run `run_a`) and, in a thread, through the
    blocking one (run `run_b`); each answer projected by its step's function."""
    got_async = []
    async with make_async() as c:
        for name, args, kwargs, see in steps(run_a):
            got_async.append(see(await getattr(c, name)(*args, **kwargs)))

    def blocking() -> list[Any]:
        with make_sync() as c:
            return [see(getattr(c, name)(*args, **kwargs))
                    for name, args, kwargs, see in steps(run_b)]

    return got_async, await asyncio.to_thread(blocking)


async def test_mwra_answers_the_same_both_ways(redis_url: str, run_id: str) -> None:
    srv = await start_mwra(MwraConfig(port=0, metrics_port=None, redis_url=redis_url,
                                      tick_seconds=0.05, lock_ttl_seconds=1.0))
    try:
        def steps(run: str) -> list[Step]:
            return [
                ("register_worker", (run, "w"), {"cpu_slots": 4}, lambda r: r.worker_id),
                ("heartbeat", (run, "w"), {}, lambda r: r.lease_seconds),
                ("register_policy", (run, "p"), {"rollout_budget": 8}, lambda r: r.live),
                ("register_policy", (run, "q"), {}, lambda r: r.min_units),
                ("get_allocation", (run, "p", 0), {}, lambda r: (r.round, r.units, r.active)),
                ("report_step_cost", (run, "p", 0, 2.0), {"units": 2},
                 lambda r: r.smoothed_cost),
                ("policy_heartbeat", (run, "q"), {}, lambda r: r.live),
                ("list_allocations", (run,), {},
                 lambda r: ([p.policy_id for p in r.policies], r.pool_units)),
                ("register_local_worker", (run, "local"), {"slots": 2},
                 lambda r: (r[0], r[1].worker_id)),
                ("deregister_policy", (run, "q"), {}, bool),
                ("deregister_worker", (run, "local"), {}, bool),
                ("delete_run", (run,), {}, lambda n: n > 0),
            ]

        got_async, got_sync = await _both(lambda: MwraClient(srv.address),
                                          lambda: AsyncMwraClient(srv.address), steps,
                                          run_id, run_id + "b")
        assert got_sync == got_async
        assert got_async[4] == (0, 2, True) and got_async[5] == pytest.approx(4.0)
    finally:
        await srv.stop(0)


async def test_mwra_watch_and_keepalive_both_ways(redis_url: str, run_id: str) -> None:
    srv = await start_mwra(MwraConfig(port=0, metrics_port=None, redis_url=redis_url,
                                      tick_seconds=0.05, lock_ttl_seconds=1.0,
                                      watch_poll_seconds=0.05))
    try:
        async with AsyncMwraClient(srv.address) as c:
            await c.register_worker(run_id, "w", cpu_slots=2)
            await c.register_policy(run_id, "p")
            await c.get_allocation(run_id, "p", 0)
            watch = c.watch_allocation(run_id, "p")
            first = await anext(watch)
            await watch.aclose()  # type: ignore[attr-defined]

        def blocking() -> tuple[Any, int]:
            with MwraClient(srv.address) as s:
                stream = s.watch_allocation(run_id, "p")
                same = next(stream)
                stream.cancel()
                with s.keepalive(run_id, "w", 0.05) as ka:
                    time.sleep(0.4)
                assert ka.last_error is None
                return same, ka.beats

        same, beats = await asyncio.to_thread(blocking)
        assert same == first and beats >= 2
    finally:
        await srv.stop(0)


async def test_see_answers_the_same_both_ways(redis_url: str, run_id: str) -> None:
    async with running_see(make_config(redis_url)) as see:
        address = f"127.0.0.1:{see.port}"

        def steps(run: str) -> list[Step]:
            records = [rollout("a", 0, f"q{i}", 0, run_id=run) for i in range(3)]
            return [
                ("create_run", (run, ["a", "b"]), {"tau": 0.5}, lambda r: list(r.config.policies)),
                ("get_run", (run,), {}, lambda r: r.config.tau),
                ("publish", (run, records), {}, lambda r: (r.stored, r.duplicates)),
                ("publish_request", (pb.PublishRequest(run_id=run, records=records[:1]),), {},
                 lambda r: r.duplicates),
                ("fetch_rollouts", (run, "b", "c1"), {"current_round": 0},
                 lambda r: sorted(d.record.prompt_id for d in r.deliveries)),
                ("take_peer_rollouts", (run, "b", "c2"), {"current_round": 0}, len),
                ("round_stats", (run, 0, ["q0"]), {}, lambda r: len(r.prompts)),
                ("successes", (run, "b", ["q0"]), {}, lambda r: {k: len(v) for k, v in r.items()}),
                ("run_stats", (run,), {}, lambda r: r.run_id == run),
                ("report_metrics", (run, []), {}, int),
                ("delete_run", (run,), {}, lambda n: n > 0),
            ]

        got_async, got_sync = await _both(lambda: SeeClient(address),
                                          lambda: AsyncSeeClient(address), steps,
                                          run_id, run_id + "b")
        assert got_sync == got_async
        assert got_async[2] == (3, 0) and got_async[4] == ["q0", "q1", "q2"]


async def test_see_subscribe_both_ways_and_cancel_from_another_thread(
        redis_url: str, run_id: str) -> None:
    async with running_see(make_config(redis_url)) as see:
        address = f"127.0.0.1:{see.port}"
        async with AsyncSeeClient(address) as c:
            await c.create_run(run_id, ["a", "b"])
            await c.publish(run_id, [rollout("a", 0, "q0", 0, run_id=run_id)])
            async for ev in c.subscribe(run_id, after_id="0-0"):
                first = ev.record.record_id
                break

        def blocking() -> tuple[str, bool]:
            with SeeClient(address) as s:
                stream = s.subscribe(run_id, after_id="0-0")
                got = next(stream).record.record_id
                # The stream waits for a next event that never comes: cancel it from elsewhere.
                threading.Timer(0.2, stream.cancel).start()
                try:
                    next(stream)
                except Exception:  # gRPC's CANCELLED or the future's CancelledError
                    return got, True
                return got, False

        got, ended = await asyncio.wait_for(asyncio.to_thread(blocking), 10)
        assert got == first and ended


@pytest.fixture
async def thl_address() -> AsyncIterator[str]:
    root = Path(next(iter(trained_tokenizers().values()))).parent
    srv = await start_thl(ThlConfig(port=0, metrics_port=None, tokenizer_roots=[root]))
    try:
        yield srv.address
    finally:
        await srv.stop(0)


async def test_thl_answers_the_same_both_ways(thl_address: str) -> None:
    paths = trained_tokenizers()
    text = "the answer is 12"

    ids = Tokenizer.from_file(str(Path(paths["byte_bpe"]) / "tokenizer.json")).encode(text).ids
    item = TraceItem(text=text, source_token_ids=ids, values=[0.5] * len(ids))

    def steps(run: str) -> list[Step]:
        return [
            ("register", (f"{run}-bpe", paths["byte_bpe"]), {}, lambda r: r.vocab_size),
            ("register", (f"{run}-wp", paths["wordpiece"]), {}, lambda r: r.vocab_size),
            ("list", (), {}, lambda r: len([t for t in r if t.tokenizer_id.startswith(run)])),
            ("retokenize", (f"{run}-bpe", [text]), {}, lambda r: r[0].token_ids.tolist()),
            ("align_trace", (f"{run}-bpe", f"{run}-wp", [item]), {},
             lambda r: [t.target_values.tolist() for t in r.results]),
        ]

    got_async, got_sync = await _both(lambda: ThlClient(thl_address),
                                      lambda: AsyncThlClient(thl_address), steps, "xa", "xb")
    assert got_sync == got_async
    assert got_async[2] == 2 and got_async[3] == list(ids) and len(got_async[4][0]) > 0
