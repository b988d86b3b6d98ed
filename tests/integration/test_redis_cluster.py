"""SEE, THL and MWRA on a real Redis Cluster of 3 masters (`redis+cluster://...`), and two SEE
replicas sharing a run on it: writers and consumers spread over both, one replica SIGKILLed
mid-run, no acknowledged record lost and none delivered twice."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from mutualrl.bench.testing import redis_servers
from mutualrl.bench.testing.see import TEST_PREFIX, make_config, rollout, running_see
from mutualrl.client.see import AsyncSeeClient, ClientOptions

pytestmark = pytest.mark.skipif(redis_servers.missing(cluster=True) is not None,
                                reason=f"needs a local Redis Cluster: "
                                       f"{redis_servers.missing(cluster=True)}")


@pytest.fixture(scope="module")
def cluster() -> Iterator[redis_servers.Cluster]:
    with redis_servers.cluster(3) as c:
        yield c


@pytest.fixture(autouse=True)
def _no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MUTUALRL_AUTH_TOKEN", raising=False)


def _rid() -> str:
    return f"cl{uuid.uuid4().hex[:10]}"


async def test_see_on_a_cluster(cluster: redis_servers.Cluster) -> None:
    async with running_see(make_config(cluster.url)) as see, \
            AsyncSeeClient(ClientOptions(address=see.address, outage_budget=0)) as c:
        runs = [_rid() for _ in range(4)]  # spread over the cluster's slots
        for run_id in runs:
            await c.create_run(run_id, ["a", "b"], tau=0.5)
        listed = {r.config.run_id for r in await c.list_runs()}
        assert set(runs) <= listed
        run_id = runs[0]
        recs = [rollout("a", 0, f"p{i}", 0) for i in range(6)]
        assert (await c.publish(run_id, recs)).stored == 6
        assert (await c.publish(run_id, recs)).duplicates == 6
        from mutualrl.bench.testing.see import stats_record, success_record

        await c.publish(run_id, [stats_record("a", 0, "p0", [1.0, 0.0]),
                                 stats_record("b", 0, "p0", [1.0]),
                                 success_record("a", 0, "p0", "x = 1")])
        got = await c.fetch_rollouts(run_id, "b", "w", max_records=16, block_ms=200)
        assert sorted(d.record.record_id for d in got.deliveries) == sorted(
            r.record_id for r in recs)
        assert await c.ack(run_id, "b", [d.delivery_id for d in got.deliveries]) == 6
        rs = await c.round_stats(run_id, 0, ["p0"])
        assert rs.complete and rs.prompts[0].pooled.count == 3
        succ = await c.successes(run_id, "b", ["p0"])
        assert [s.text for s in succ["p0"]] == ["x = 1"]
        events = []
        async for ev in c.subscribe(run_id, after_id="0-0"):
            events.append(ev)
            if len(events) == 9:
                break
        assert len(events) == 9
        stats = await c.run_stats(run_id)
        assert stats.stream_lengths["ROLLOUT"] == 6 and stats.duplicates == 6
        for r in runs:
            assert await c.delete_run(r) > 0


def test_thl_registry_on_a_cluster(cluster: redis_servers.Cluster) -> None:
    from mutualrl.thl.registry import RedisStore

    store = RedisStore(cluster.url, TEST_PREFIX)
    tid = f"tok-{uuid.uuid4().hex[:8]}"
    try:
        store.put(tid, {"path": "/x", "runs": ["r1"]})
        assert store.get(tid) == {"path": "/x", "runs": ["r1"]}
        assert store.update(tid, lambda cur: {**(cur or {}), "runs": ["r1", "r2"]}) == {
            "path": "/x", "runs": ["r1", "r2"]}
        assert store.load_all()[tid]["runs"] == ["r1", "r2"]
        assert store.update(tid, lambda cur: None) is None
        assert store.get(tid) is None
    finally:
        store.close()


async def test_mwra_store_on_a_cluster(cluster: redis_servers.Cluster) -> None:
    from mutualrl.mwra.store import MwraStore, PolicyRecord, WorkerRecord

    store = MwraStore.from_url(cluster.url, prefix=TEST_PREFIX)
    run_id = _rid()
    try:
        await store.put_worker(run_id, WorkerRecord("w1", cpu_slots=2, gpu_count=0), 5.0)
        await store.put_policy(run_id, PolicyRecord("a"))
        cost = await store.record_cost(run_id, "a", round_=0, seconds=1.5, tokens=10,
                                       samples=2, units=1, alpha=0.5)
        assert cost.smoothed is not None
        state = await store.load(run_id)
        assert set(state.workers) == {"w1"} and set(state.policies) == {"a"}
        assert await store.acquire_or_renew(run_id, "replica-1", 5.0) > 0
        assert await store.leader(run_id) == "replica-1"
        assert await store.release(run_id, "replica-1")
        await store.want_round(run_id, 3)
        assert await store.wanted_round(run_id) == 3
        assert await store.delete_run(run_id) > 0
    finally:
        await store.close()


# ------------------------------------------------------------------ two replicas, one killed

def _start_replica(url: str, tmp: Path, name: str) -> tuple[subprocess.Popen[bytes], int]:
    port = redis_servers.free_port()
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(f"see:\n  key_prefix: {TEST_PREFIX}\n  rest_port: null\n"
                   f"  grace_seconds: 0.2\n")
    proc = subprocess.Popen([sys.executable, "-m", "mutualrl.cli", "--log-level", "WARNING",
                             "see", "serve", "--config", str(cfg), "--port", str(port),
                             "--redis-url", url],
                            env={**os.environ, "MUTUALRL_AUTH_TOKEN": ""},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"replica {name} exited"
        try:
            with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                        timeout=1)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return proc, port
        except grpc.RpcError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"replica {name} did not become healthy")


async def test_two_replicas_share_a_run_and_survive_a_sigkill(
        cluster: redis_servers.Cluster, tmp_path: Path) -> None:
    (p1, port1), (p2, port2) = (_start_replica(cluster.url, tmp_path, "r1"),
                                _start_replica(cluster.url, tmp_path, "r2"))
    # One address for both replicas; each client prefers one of them (pick_first) and moves to
    # the other when its replica is gone.
    both = [f"ipv4:127.0.0.1:{port1},127.0.0.1:{port2}",
            f"ipv4:127.0.0.1:{port2},127.0.0.1:{port1}"]

    def client(i: int) -> AsyncSeeClient:
        return AsyncSeeClient(ClientOptions(address=both[i % 2], timeout=20,
                                            backoff_base=0.05))

    run_id = _rid()
    batches, per_batch = 24, 5
    published: dict[str, list[str]] = {"a": [], "b": []}
    received: dict[str, Counter[str]] = {"a": Counter(), "b": Counter()}
    writers_done = asyncio.Event()
    killed = asyncio.Event()

    async def call_until_done(fn: Any) -> Any:
        """What a client does: retry a call that failed until it succeeds (the calls are
        idempotent: Publish by record id, Ack by delivery id)."""
        for _ in range(100):
            try:
                return await fn()
            except grpc.RpcError as err:
                assert err.code() in (grpc.StatusCode.UNAVAILABLE,
                                      grpc.StatusCode.DEADLINE_EXCEEDED), err.details()
                await asyncio.sleep(0.1)
        raise AssertionError("never succeeded")

    async def writer(policy: str, i: int) -> None:
        async with client(i) as c:
            for k in range(batches):
                recs = [rollout(policy, 0, f"q{k}", j, n_tokens=24) for j in range(per_batch)]
                await call_until_done(lambda recs=recs: c.publish(run_id, recs))
                published[policy] += [r.record_id for r in recs]
                if k == batches // 3 and policy == "a" and not killed.is_set():
                    p1.send_signal(signal.SIGKILL)  # replica 1 dies mid-run
                    killed.set()
                await asyncio.sleep(0.02)

    async def consumer(policy: str, i: int) -> None:
        peer = "b" if policy == "a" else "a"
        async with client(i) as c:
            while True:
                got = await call_until_done(lambda: c.fetch_rollouts(
                    run_id, policy, f"{policy}-c{i}", max_records=16, block_ms=200))
                for d in got.deliveries:
                    received[policy][d.record.record_id] += 1
                if got.deliveries:
                    ids = [d.delivery_id for d in got.deliveries]
                    await call_until_done(lambda ids=ids: c.ack(run_id, policy, ids))
                if writers_done.is_set() and set(received[policy]) >= set(published[peer]):
                    return

    try:
        async with client(0) as c:
            await call_until_done(lambda: c.create_run(run_id, ["a", "b"]))
        consumers = [asyncio.create_task(consumer(p, i)) for p in ("a", "b") for i in (0, 1)]
        await asyncio.gather(writer("a", 0), writer("b", 1))
        writers_done.set()
        await asyncio.wait_for(asyncio.gather(*consumers), timeout=120)
        assert killed.is_set() and p1.poll() is not None
        for policy, peer in (("a", "b"), ("b", "a")):
            assert len(published[peer]) == batches * per_batch
            # Every acknowledged record of the peer arrived, each exactly once.
            assert set(received[policy]) == set(published[peer])
            assert max(received[policy].values()) == 1, received[policy].most_common(3)
        async with client(1) as c:
            stats = await call_until_done(lambda: c.run_stats(run_id))
            counts = {p.policy_id: p.published["ROLLOUT"] for p in stats.policies}
            assert counts == {"a": batches * per_batch, "b": batches * per_batch}
            await call_until_done(lambda: c.delete_run(run_id))
    finally:
        for p in (p1, p2):
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)



async def test_fsync_durability_is_refused_on_a_cluster_without_aof(
        cluster: redis_servers.Cluster) -> None:
    from mutualrl.see.server import start_see
    from mutualrl.see.store.durability import DurabilityError

    with pytest.raises(DurabilityError, match="appendonly no"):
        await start_see(make_config(cluster.url, durability="fsync"))
