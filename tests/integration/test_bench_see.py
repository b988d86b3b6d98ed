"""`mutualrl bench see` end to end on a small load: a real SEE server process, real writer
processes on both sides, the real Redis; the figures are the ones docs/benchmarks.md reports."""

from __future__ import annotations

import statistics
import time

import grpc
import pytest
import redis

from mutualrl.bench.see import BENCH_PREFIX, _connections_per_worker, _start_server, run_bench

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_bench_pairs_both_sides_and_reports_paired_ratios(redis_url: str) -> None:
    # Enough records that the server's CPU time spans several clock ticks (/proc counts CPU
    # in 10 ms steps): with 256 it could read 0.
    res = run_bench(clients=2, records=4096, batch=128, tokens=20, redis_url=redis_url,
                    repeats=2, warmup=1)
    assert res["records_per_side"] == 4096 and res["repeats"] == 2 and res["redis"] == "single"
    see, raw = res["see_all"], res["raw_redis_all"]
    assert len(see) == len(raw) == 2
    # The warm-up pair ran in full and is reported apart, in no figure.
    (warm,) = res["warmup"]
    assert warm["see"]["records"] == warm["raw_redis"]["records"] == 4096
    assert warm["ratio"] == warm["see"]["records_per_s"] / warm["raw_redis"]["records_per_s"]
    for side in (*see, *raw):
        assert side["records"] == 4096 and side["batches"] == 4096 // 128  # 2 writers x 16
        assert side["records_per_s"] > 0 and 0 < side["p50_ms"] <= side["p99_ms"]
        assert side["cpu"]["writers_us_per_record"] > 0
    assert all(s["cpu"]["server_us_per_record"] > 0 for s in see)
    assert all(r["cpu"]["server_us_per_record"] == 0 for r in raw)
    # One server process held both writers' connections; the raw side has no server.
    assert [s["connections_per_worker"] for s in see] == [[2], [2]]
    assert all(r["connections_per_worker"] == [] for r in raw)
    pairs = [s["records_per_s"] / r["records_per_s"] for s, r in zip(see, raw, strict=True)]
    assert res["ratios"] == sorted(pairs)
    assert res["ratio"] == sorted(pairs)[1]
    assert res["p99_ratio"] == pytest.approx(statistics.median(
        s["p99_ms"] / r["p99_ms"] for s, r in zip(see, raw, strict=True)))
    assert res["see_stream_memory_bytes"] > 0
    # The load the figures were taken under (1, 5 and 15 minute averages).
    assert len(res["load_average_start"]) == len(res["load_average_end"]) == 3
    assert all(x >= 0 for x in (*res["load_average_start"], *res["load_average_end"]))
    # Each repeat's run was deleted through SEE, the raw side's stream with it.
    assert len(set(res["run_ids"])) == 3  # the warm-up's too
    client = redis.Redis.from_url(redis_url)
    try:
        for run in res["run_ids"]:
            assert not list(client.scan_iter(f"{BENCH_PREFIX}*{run}*", count=1000)), run
    finally:
        client.close()


def test_the_bench_reports_how_the_writers_connections_spread_over_see_workers(
        redis_url: str) -> None:
    proc, addr, _ = _start_server(redis_url, workers=2)
    port = int(addr.rsplit(":", 1)[1])
    # (a channel of its own each: channels to one address in one process share a connection)
    channels = [grpc.insecure_channel(addr, options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(5)]
    try:
        deadline = time.time() + 30
        while len(_connections_per_worker(proc.pid, port)) < 2 and time.time() < deadline:
            time.sleep(0.2)  # until the second worker listens too
        for ch in channels:
            grpc.channel_ready_future(ch).result(timeout=10)
        spread = _connections_per_worker(proc.pid, port)
        # Both workers listen; between them they hold the 5 connections, largest share first.
        assert len(spread) == 2 and sum(spread) == 5 and spread == sorted(spread, reverse=True)
        channels.pop().close()
        deadline = time.time() + 10
        while sum(_connections_per_worker(proc.pid, port)) != 4 and time.time() < deadline:
            time.sleep(0.1)
        assert sum(_connections_per_worker(proc.pid, port)) == 4
    finally:
        for ch in channels:
            ch.close()
        proc.terminate()
        proc.wait(timeout=30)
