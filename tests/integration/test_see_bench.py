"""`mutualrl bench see` end to end on a small load: a real SEE server process, real writer
processes on both sides, the real Redis; the figures are the ones the README row reports."""

from __future__ import annotations

import statistics

import pytest
import redis

from mutualrl.see.bench import BENCH_PREFIX, run_bench

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
