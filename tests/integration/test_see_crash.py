"""`mutualrl see serve` killed with SIGKILL mid-stream loses no acknowledged record."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
import redis

from mutualrl.bench.testing.see import TEST_PREFIX, rollout
from mutualrl.client.see import ClientOptions, SeeClient
from mutualrl.see.keys import RunKeys
from mutualrl.v1 import experience_pb2 as pb

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(cfg: Path, port: int, rest_port: int, redis_url: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "MUTUALRL_AUTH_TOKEN"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mutualrl.cli", "--log-level", "WARNING", "see", "serve",
         "--config", str(cfg), "--port", str(port), "--rest-port", str(rest_port),
         "--redis-url", redis_url], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{rest_port}/healthz", timeout=1):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("SEE did not start")


def test_sigkill_loses_no_acknowledged_record(redis_url: str, run_id: str,
                                              tmp_path: Path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"see:\n  key_prefix: {TEST_PREFIX}\n")
    port, rest_port = _free_port(), _free_port()
    proc = _start(cfg, port, rest_port, redis_url)
    try:
        _crash_and_restart(proc, cfg, port, rest_port, redis_url, run_id)
    finally:  # never leave a server behind, whatever failed
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _crash_and_restart(proc: subprocess.Popen[bytes], cfg: Path, port: int, rest_port: int,
                       redis_url: str, run_id: str) -> None:
    acked: list[str] = []
    errors: list[grpc.StatusCode] = []
    opts = ClientOptions(address=f"127.0.0.1:{port}", outage_budget=0, timeout=5, token=None)
    with SeeClient(opts) as c:
        c.create_run(run_id, ["a", "b"], tau=1.0)

    def publish_forever() -> None:
        with SeeClient(opts) as c:
            for batch in range(10_000):
                recs = [rollout("a", batch, f"p{i}", i, n_tokens=32) for i in range(20)]
                try:
                    resp = c.publish(run_id, recs)
                except grpc.RpcError as err:
                    errors.append(err.code())
                    return
                acked.extend(r.record_id for r in resp.results
                             if r.status == pb.PUBLISH_STATUS_STORED)

    writer = threading.Thread(target=publish_forever)
    writer.start()
    deadline = time.monotonic() + 20
    while len(acked) < 300 and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)  # mid-stream: the writer is inside a Publish call
    proc.wait(10)
    writer.join(20)
    assert not writer.is_alive()
    assert errors == [grpc.StatusCode.UNAVAILABLE]
    assert len(acked) >= 300

    # Everything acknowledged is in Redis, stream and index agreeing.
    r = redis.Redis.from_url(redis_url)
    k = RunKeys(TEST_PREFIX, run_id)
    held = r.xlen(k.stream(pb.ROLLOUT))
    assert held >= len(acked)
    assert held == r.hlen(k.idx)
    locs = [loc.decode().split(":") for loc in r.hmget(k.idx, acked)]
    pipe = r.pipeline()
    for _, _, nonce, _, _ in locs:
        pipe.strlen(k.batch(nonce))
    assert all(n >= int(off) + int(length)
               for n, (_, _, _, off, length) in zip(pipe.execute(), locs, strict=True))

    # Restart: the API serves all of them, and republishing stores nothing twice.
    proc = _start(cfg, port, rest_port, redis_url)
    try:
        listed: set[str] = set()
        cursor = ""
        while True:
            url = f"http://127.0.0.1:{rest_port}/v1/runs/{run_id}/records?limit=1000"
            with urllib.request.urlopen(url + (f"&cursor={cursor}" if cursor else "")) as resp:
                page = json.loads(resp.read())
            listed |= {x["record_id"] for x in page["records"]}
            if page["next_cursor"] is None:
                break
            cursor = page["next_cursor"]
        assert set(acked) <= listed and len(listed) == held
        with SeeClient(opts.model_copy(update={"outage_budget": 30.0})) as c:
            assert c.run_stats(run_id).policies[0].published["ROLLOUT"] == held
            again = c.publish(run_id, [rollout("a", 0, f"p{i}", i, n_tokens=32)
                                       for i in range(20)])
            assert again.duplicates == 20 and again.stored == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
    assert proc.returncode == 0
