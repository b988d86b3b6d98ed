"""`mutualrl bench see`: SEE Publish throughput against raw Redis pipelines, measured in one run.

Both sides write the same serialized ROLLOUT payloads (about 300 tokens with offsets and
log-probs each) from the same number of writer processes with the same batch size:

- ours: each writer process owns a gRPC channel and sends Publish calls of `batch` records to
  a SEE server running in its own process (`mutualrl see serve`), which validates, indexes and
  stores them through its Lua script;
- anchor: each writer process sends the payloads straight to Redis with redis-py pipelines
  (`XADD <stream> * d <payload>` x batch, one round trip per batch).

Figures: records/s of both, `ratio` = ours / raw redis, p50/p99 latency of one batch, and
`p99_ratio` = ours / raw redis p99, each paired per repeat (medians over repeats). Warm-up
pairs run first and count in none of them. Each SEE repeat also reports how the writers'
connections fell over SEE's processes (`connections_per_worker`; it matters with `--workers N`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mutualrl.see.keys import RunKeys
from mutualrl.v1 import experience_pb2 as pb

BENCH_PREFIX = "mrlbench"


def _records(worker: int, n: int, tokens: int, run_id: str) -> list[bytes]:
    """`n` serialized ROLLOUT records of `tokens` tokens each for one writer."""
    from mutualrl.bench.testing.see import rollout

    out = []
    for i in range(n):
        rec = rollout(f"p{worker % 4}", i // 64, f"q{i % 64}", worker * 1_000_000 + i,
                      n_tokens=tokens, reward=float(i % 2))
        rec.run_id = run_id
        out.append(rec.SerializeToString())
    return out


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[k]


def _writer(side: str, worker: int, n: int, batch: int, tokens: int, target: str, run_id: str,
            ready: Any, start: Any, results: Any) -> None:
    """One writer process: prepare everything, wait at the barrier, write, report."""
    payloads = _records(worker, n, tokens, run_id)
    batches = [payloads[i:i + batch] for i in range(0, len(payloads), batch)]
    lat: list[float] = []
    if side == "see":
        import grpc

        from mutualrl.common.channel import ClientOptions

        opts = ClientOptions(address=target)
        channel = grpc.insecure_channel(target)
        # Requests assembled from the serialized payloads up front: the client cost measured
        # is the call, as the raw side's is the pipeline execution.
        reqs: list[bytes] = []
        for b in batches:
            msg = pb.PublishRequest(run_id=run_id)
            for p in b:
                msg.records.add().ParseFromString(p)
            reqs.append(msg.SerializeToString())
        call = channel.unary_unary(
            "/mutualrl.v1.ExperienceExchange/Publish",
            request_serializer=None, response_deserializer=pb.PublishResponse.FromString)
        md = opts.metadata()
        # Warm the channel (connection set-up is not what is measured): an empty batch.
        call(pb.PublishRequest(run_id=run_id).SerializeToString(), timeout=60, metadata=md)
        ready.put(worker)
        start.wait()
        t0 = time.perf_counter()
        c0 = time.process_time()
        stored = 0
        for req in reqs:
            s = time.perf_counter()
            resp = call(req, timeout=60, metadata=md)
            lat.append(time.perf_counter() - s)
            stored += resp.stored
        t1 = time.perf_counter()
        cpu = time.process_time() - c0
        channel.close()
        results.put((side, worker, t0, t1, lat, stored, cpu))
    else:
        from mutualrl.common.redis_connect import sync_client

        r = sync_client(target)
        # In the run's key space, so SEE's DeleteRun of the run removes it too.
        stream = RunKeys(BENCH_PREFIX, run_id).base + "raw"
        r.ping()
        ready.put(worker)
        start.wait()
        t0 = time.perf_counter()
        c0 = time.process_time()
        for b in batches:
            s = time.perf_counter()
            pipe = r.pipeline(transaction=False)
            for p in b:
                pipe.xadd(stream, {"d": p})
            pipe.execute()
            lat.append(time.perf_counter() - s)
        t1 = time.perf_counter()
        cpu = time.process_time() - c0
        r.close()
        results.put((side, worker, t0, t1, lat, n, cpu))


def _process_tree(pid: int) -> list[int]:
    """`pid` and its live descendants (SEE's extra workers), from /proc ([pid] elsewhere)."""
    out = [pid]
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                out += _process_tree(int(child))
    except (OSError, ValueError):
        pass
    return out


def _proc_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) a process and its live descendants have used so far, from
    /proc (0 elsewhere)."""
    if pid is None:
        return 0.0
    total = 0.0
    for p in _process_tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            pass
    return total


def _connections_per_worker(pid: int, port: int) -> list[int]:
    """Established TCP connections on `port` held by each SEE process (`pid` and its workers),
    largest first: a worker's share of the writers is its share of the work, and the kernel
    spreads connections by hash, not by load (`SeeConfig.workers`). From /proc ([] where it
    cannot be read)."""
    # /proc/net/tcp{,6}: local address "ADDR:PORT" in hex, state (01 established, 0A listening),
    # socket inode.
    state_of: dict[str, str] = {}
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 9 and int(cols[1].rsplit(":", 1)[1], 16) == port:
                state_of[cols[9]] = cols[3]
    counts = []
    for p in _process_tree(pid):
        states = []
        try:
            for fd in Path(f"/proc/{p}/fd").iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if link.startswith("socket:["):
                        states.append(state_of.get(link[8:-1]))
        except OSError:
            continue
        if "0A" in states:  # a worker: it listens on the port
            counts.append(states.count("01"))
    return sorted(counts, reverse=True)


def _redis_cmd_usec(client: Any, command: str) -> int:
    """Redis time in `command` so far (summed over a cluster's masters)."""
    import redis

    key = f"cmdstat_{command}"
    if isinstance(client, redis.RedisCluster):
        per = client.info("commandstats", target_nodes=redis.RedisCluster.PRIMARIES)
        return sum(int(v.get(key, {}).get("usec", 0)) for v in per.values())
    return int(client.info("commandstats").get(key, {}).get("usec", 0))


def _run_side(side: str, clients: int, per_client: int, batch: int, tokens: int, target: str,
              run_id: str, server_pid: int | None = None, rds: Any = None) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    ready = ctx.Queue()
    results = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(side, w, per_client, batch, tokens, target,
                                               run_id, ready, start, results), daemon=True)
             for w in range(clients)]
    for p in procs:
        p.start()
    # Every writer builds its payloads and connects before anyone starts the clock.
    for _ in procs:
        ready.get(timeout=300)
    # CPU actually spent per record, which the load of other processes on a shared machine
    # distorts far less than wall-clock throughput: writers' own CPU, the SEE server's CPU,
    # and Redis' time in the side's commands (EXEC holds the whole SEE transaction).
    command = "xadd" if side == "raw" else "exec"
    spread = (_connections_per_worker(server_pid, int(target.rsplit(":", 1)[1]))
              if side == "see" and server_pid is not None else [])
    srv0 = _proc_cpu(server_pid) if side == "see" else 0.0
    red0 = _redis_cmd_usec(rds, command) if rds is not None else 0
    start.set()
    got = [results.get(timeout=600) for _ in procs]
    server_cpu = (_proc_cpu(server_pid) - srv0) if side == "see" else 0.0
    redis_us = (_redis_cmd_usec(rds, command) - red0) if rds is not None else 0
    for p in procs:
        p.join(timeout=30)
    t0 = min(g[2] for g in got)
    t1 = max(g[3] for g in got)
    lat = [x for g in got for x in g[4]]
    records = sum(g[5] for g in got)
    if records != clients * per_client:
        raise RuntimeError(f"{side}: {records} records written, expected {clients * per_client}")
    writer_cpu = sum(g[6] for g in got)
    cpu = {"writers_us_per_record": writer_cpu / records * 1e6,
           "server_us_per_record": server_cpu / records * 1e6,
           "redis_us_per_record": redis_us / records,
           "total_us_per_record": (writer_cpu + server_cpu) / records * 1e6 + redis_us / records}
    return {"records": records, "seconds": t1 - t0, "records_per_s": records / (t1 - t0),
            "cpu": cpu,
            "p50_ms": _percentile(lat, 0.5) * 1000, "p99_ms": _percentile(lat, 0.99) * 1000,
            "batches": len(lat), "connections_per_worker": spread}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_server(redis_url: str, workers: int = 1, durability: str = "default"
                  ) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = _free_port()
    cfg_dir = Path(tempfile.mkdtemp(prefix="see-bench-"))
    cfg = cfg_dir / "run.yaml"
    cfg.write_text(f"see:\n  key_prefix: {BENCH_PREFIX}\n  rest_port: null\n"
                   f"  workers: {workers}\n  durability: {durability}\n")
    env = dict(os.environ)
    env.pop("MUTUALRL_AUTH_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mutualrl.cli", "--log-level", "WARNING", "see", "serve",
         "--config", str(cfg), "--port", str(port), "--redis-url", redis_url],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    addr = f"127.0.0.1:{port}"
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.time() + 30
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"SEE exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        try:
            with grpc.insecure_channel(addr) as ch:
                r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                        timeout=1)
                if r.status == health_pb2.HealthCheckResponse.SERVING:
                    return proc, addr, cfg_dir
        except grpc.RpcError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("SEE did not become healthy in 30 s")


def run_bench(clients: int, records: int, batch: int, tokens: int, redis_url: str,
              repeats: int = 1, workers: int = 1, durability: str = "default",
              warmup: int = 0) -> dict[str, Any]:
    """Run `warmup` pairs (reported apart, counted in no figure) and then `repeats` pairs.

    A warm-up pair matters on a Redis that has not yet held this much: its first pair's writes
    grow Redis's memory (XADD cost 3-4x its steady rate on a fresh one), which slows whichever
    side writes first and skews that pair's ratio."""
    import grpc

    from mutualrl.common.redis_connect import is_cluster, sync_client
    from mutualrl.v1 import experience_pb2_grpc as pb_grpc
    from mutualrl.v1 import runs_pb2

    per_client = max(batch, records // clients)
    # (the load before the server starts: what the machine was doing when the bench began)
    load_start = os.getloadavg()
    proc, addr, cfg_dir = _start_server(redis_url, workers, durability)
    del cfg_dir  # a small temp file; kept for debugging a failed run
    r = sync_client(redis_url)
    see_runs: list[dict[str, Any]] = []
    raw_runs: list[dict[str, Any]] = []
    run_ids: list[str] = []
    try:
        for i in range(warmup + repeats):
            run_id = f"bench-{uuid.uuid4().hex[:8]}"
            run_ids.append(run_id)
            # The raw stub, not the SDK's client: mutualrl-see does not depend on the SDK.
            with grpc.insecure_channel(addr) as channel:
                pb_grpc.ExperienceExchangeStub(channel).CreateRun(pb.CreateRunRequest(
                    config=pb.RunConfig(
                        run_id=run_id, policies=["p0", "p1", "p2", "p3"], tau=1.0,
                        retention=pb.Retention(max_stream_len=10 * clients * per_client,
                                               ttl_seconds=3600))), timeout=30)
            try:
                # Back to back, order alternating: a paired ratio per repeat cancels most of
                # the drift of a shared machine's load.
                sides = [("raw", redis_url), ("see", addr)]
                if i % 2:
                    sides.reverse()
                for side, target in sides:
                    res = _run_side(side, clients, per_client, batch, tokens, target, run_id,
                                    proc.pid, r)
                    (raw_runs if side == "raw" else see_runs).append(res)
                used = r.memory_usage(RunKeys(BENCH_PREFIX, run_id).stream(pb.ROLLOUT)) or 0
            finally:
                with grpc.insecure_channel(addr) as channel:
                    pb_grpc.ExperienceExchangeStub(channel).DeleteRun(
                        runs_pb2.DeleteRunRequest(run_id=run_id), timeout=30)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        r.close()
    warm = [{"see": s, "raw_redis": r, "ratio": s["records_per_s"] / r["records_per_s"]}
            for s, r in zip(see_runs[:warmup], raw_runs[:warmup], strict=True)]
    see_runs, raw_runs = see_runs[warmup:], raw_runs[warmup:]
    ratios = sorted(s["records_per_s"] / r["records_per_s"]
                    for s, r in zip(see_runs, raw_runs, strict=True))
    mid = len(ratios) // 2
    # Median paired ratio; its repeat's figures are the ones reported.
    pick = next(i for i, (s, r) in enumerate(zip(see_runs, raw_runs, strict=True))
                if s["records_per_s"] / r["records_per_s"] == ratios[mid])
    see_best, raw_best = see_runs[pick], raw_runs[pick]
    sample = _records(0, 1, tokens, "x")[0]
    return {
        "benchmark": "see_publish",
        "clients": clients, "server_workers": workers, "durability": durability,
        "redis": "cluster" if is_cluster(redis_url) else "single",
        "records_per_side": clients * per_client, "batch": batch,
        "tokens_per_record": tokens, "payload_bytes": len(sample),
        "cpu_count": os.cpu_count(), "repeats": repeats,
        "see": see_best, "raw_redis": raw_best,
        "ratio": ratios[mid],
        "ratios": ratios,
        # raw CPU per record / SEE CPU per record (median over repeats): the efficiency
        # ratio, steadier than the throughput ratio when the machine is shared.
        "cpu_ratio": statistics.median(
            r["cpu"]["total_us_per_record"] / s["cpu"]["total_us_per_record"]
            for s, r in zip(see_runs, raw_runs, strict=True)),
        # SEE's p99 batch latency / raw's, paired per repeat (median): the tail target.
        "p99_ratio": statistics.median(
            s["p99_ms"] / r["p99_ms"] for s, r in zip(see_runs, raw_runs, strict=True)),
        "see_all": see_runs, "raw_redis_all": raw_runs,
        "warmup": warm,
        "see_stream_memory_bytes": used,
        "load_average_start": list(load_start),
        "load_average_end": list(os.getloadavg()),
        "run_ids": run_ids,
        "target_ratio": 0.65,
        "target_p99_ratio": 1.5,
    }


@contextlib.contextmanager
def _redis_for(args: argparse.Namespace) -> Iterator[str]:
    """The Redis both sides write to: --redis-url, or a private one the case needs (a 3-master
    cluster for --cluster; a server with appendfsync always for --durability fsync)."""
    from mutualrl.bench.testing import redis_servers
    from mutualrl.see.config import _default_redis_url

    if args.cluster:
        with redis_servers.cluster(3) as c:
            yield c.url
    elif args.durability == "fsync" and not args.redis_url:
        with redis_servers.server(["--appendonly", "yes", "--appendfsync", "always"]) as s:
            yield s.url
    else:
        yield args.redis_url or _default_redis_url()


def main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    with _redis_for(args) as redis_url:
        result = run_bench(args.clients, args.records, args.batch, args.tokens, redis_url,
                           args.repeats, args.workers, args.durability, args.warmup)
    Path(args.json).write_text(json.dumps(result, indent=2))
    t = Table(title=f"SEE Publish ({result['server_workers']} server worker(s)) vs raw Redis "
                    f"({result['clients']} writer processes each side, batch "
                    f"{result['batch']}, {result['tokens_per_record']} tokens, "
                    f"{result['payload_bytes']} B/record)")
    for col in ("side", "records", "records/s", "p50 ms", "p99 ms"):
        t.add_column(col, justify="right")
    for name, key in (("SEE gRPC Publish", "see"), ("raw Redis pipeline", "raw_redis")):
        d = result[key]
        t.add_row(name, str(d["records"]), f"{d['records_per_s']:,.0f}", f"{d['p50_ms']:.2f}",
                  f"{d['p99_ms']:.2f}")
    console = Console()
    console.print(t)
    verdict = "meets" if result["ratio"] >= result["target_ratio"] else "misses"
    console.print(f"ratio SEE/raw = {result['ratio']:.3f} ({verdict} the "
                  f"{result['target_ratio']} target; median "
                  f"of {len(result['ratios'])} paired runs); CPU per record: SEE "
                  f"{result['see']['cpu']['total_us_per_record']:.0f} µs, raw "
                  f"{result['raw_redis']['cpu']['total_us_per_record']:.0f} µs (cpu_ratio "
                  f"{result['cpu_ratio']:.3f}); p99 SEE/raw = {result['p99_ratio']:.2f} "
                  f"(median of paired repeats; target {result['target_p99_ratio']}); "
                  f"load average at the start {result['load_average_start'][0]:.2f}; "
                  f"written to {args.json}")
    if result["server_workers"] > 1:
        console.print("writers' connections per SEE worker (SO_REUSEPORT's spread), by repeat: "
                      + ", ".join("+".join(map(str, s["connections_per_worker"]))
                                  for s in result["see_all"]))
    if result["warmup"]:
        console.print("warm-up pair(s), in no figure: ratio "
                      + ", ".join(f"{w['ratio']:.3f}" for w in result["warmup"]))
    return 0
