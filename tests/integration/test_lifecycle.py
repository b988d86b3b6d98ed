"""The one server lifecycle every service shares (mutualrl.common.grpc_server): health turns
NOT_SERVING before the drain, drain and close hooks run once in order however often stop is
called, and `mutualrl <service> serve` stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mutualrl.common.config import ServiceConfig
from mutualrl.common.grpc_server import start_server

pytestmark = pytest.mark.timeout(60)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def test_stop_goes_not_serving_then_drains_then_closes_once() -> None:
    running = await start_server(ServiceConfig(port=0), lambda s: None, ["mutualrl.v1.Test"])
    events: list[str] = []
    watched: list[int] = []
    drained = asyncio.Event()

    async def drain() -> None:
        # Health already says NOT_SERVING when the drain starts.
        await asyncio.sleep(0.2)
        events.append(f"drain seen={list(watched)}")
        drained.set()

    async def close() -> None:
        events.append("close")

    running.on_drain.append(drain)
    running.on_close.append(close)
    async with grpc.aio.insecure_channel(running.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        watch = stub.Watch(health_pb2.HealthCheckRequest(service="mutualrl.v1.Test"))

        async def follow() -> None:
            async for reply in watch:
                watched.append(reply.status)

        follower = asyncio.ensure_future(follow())
        while not watched:
            await asyncio.sleep(0.01)
        assert watched == [SERVING]
        # Three concurrent stops and a later one: one shutdown.
        await asyncio.gather(running.stop(0.5), running.stop(0.5), running.stop(0))
        await running.stop(0)
        with pytest.raises(grpc.aio.AioRpcError):
            await follower
    assert events == [f"drain seen={[SERVING, NOT_SERVING]}", "close"]
    assert running.stopped


async def test_a_failing_hook_does_not_keep_the_others_from_running() -> None:
    running = await start_server(ServiceConfig(port=0), lambda s: None, [])
    ran: list[str] = []

    async def broken() -> None:
        raise RuntimeError("boom")

    async def release() -> None:
        ran.append("release")

    running.on_close.extend([broken, release])
    await running.stop(0)
    assert ran == ["release"]


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_thl_serve_stops_cleanly_on_sigterm(loop: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MUTUALRL_AUTH_TOKEN", None)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"thl:\n  event_loop: {loop}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mutualrl.cli", "--log-level", "INFO", "thl", "serve",
         "--config", str(cfg), "--port", "0", "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        m = re.search(r"THL listening on \S+:(\d+)", line)
        assert m, line
        with grpc.insecure_channel(f"127.0.0.1:{m.group(1)}") as ch:
            reply = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(),
                                                         timeout=10)
            assert reply.status == SERVING
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() - t0 < 10
        assert proc.stderr is not None
        # The server says which loop it runs on when it starts listening.
        assert f"loop={loop})" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
