"""Run SEE: the gRPC server and the REST app in one process and one event loop.

The lifecycle is the common one (`mutualrl.common.grpc_server`): on stop, health turns
NOT_SERVING, Subscribe streams and round-stats waits end (drain hook), calls in flight get the
grace period, then the REST app stops and the Redis pool closes (close hooks)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import uvicorn

from mutualrl.common import event_loop
from mutualrl.common.grpc_server import ServiceServer, serve_until_signalled, start_server
from mutualrl.see.config import SeeConfig
from mutualrl.see.grpc.access import LARGE_REQUESTS, access
from mutualrl.see.grpc.runmetrics import SERVICE_NAME as METRICS_SERVICE_NAME
from mutualrl.see.grpc.runmetrics import RunMetricsServicer
from mutualrl.see.grpc.runmetrics import add_to_server as add_metrics_to_server
from mutualrl.see.grpc.servicer import SERVICE_NAME, ExperienceExchangeServicer, add_to_server
from mutualrl.see.rest.app import create_app
from mutualrl.see.store import SeeStore, durability

log = logging.getLogger(__name__)


class _EmbeddedUvicorn(uvicorn.Server):
    """uvicorn inside our loop: signals belong to `serve_until_signalled`, not to uvicorn."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def install_signal_handlers(self) -> None:  # older uvicorn
        return None


@dataclass
class SeeServer(ServiceServer):
    """A running SEE: gRPC (`grpc`), REST (`rest_port`, None when disabled) and the store."""

    cfg: SeeConfig
    store: SeeStore
    rest_port: int | None

    @property
    def rest_url(self) -> str | None:
        if self.rest_port is None:
            return None
        scheme = "https" if self.cfg.tls_cert else "http"
        return f"{scheme}://127.0.0.1:{self.rest_port}"


async def start_see(cfg: SeeConfig, *, shared_port: bool = False) -> SeeServer:
    """Connect to Redis, start the gRPC server and (unless rest_port is None) the REST app.

    `shared_port`: bind with SO_REUSEPORT (multi-worker serving)."""
    store = SeeStore(cfg)
    if cfg.durability == "default" and not await store.ping():
        log.warning("Redis at %s does not answer yet; calls fail with UNAVAILABLE until it does",
                    cfg.redis_url)
    try:
        # fsync: the server must be able to put each batch on disk before it is acknowledged.
        store.publisher.mode = await durability.check(store.r, cfg.durability, cfg.redis_url)
    except durability.DurabilityError:
        await store.close()
        raise
    servicer = ExperienceExchangeServicer(store)
    metrics_servicer = RunMetricsServicer(store)

    def add(server: grpc.aio.Server) -> None:
        add_to_server(servicer, server)
        add_metrics_to_server(metrics_servicer, server)

    running = await start_server(cfg, add, [SERVICE_NAME, METRICS_SERVICE_NAME],
                                 reuse_port=shared_port, access=access(cfg.limits),
                                 large_requests=dict.fromkeys(LARGE_REQUESTS,
                                                              cfg.max_message_bytes))
    # Ends Subscribe streams and round-stats waits before the gRPC server drains.
    running.on_drain.append(store.begin_stop)
    rest_port: int | None = None
    if cfg.rest_port is not None:
        host = cfg.rest_host or cfg.host
        # Bind the socket ourselves so port 0 works and the real port is known at once.
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, cfg.rest_port))
        sock.listen(1024)
        sock.setblocking(False)
        rest_port = sock.getsockname()[1]
        ucfg = uvicorn.Config(
            create_app(store, cfg.resolved_token()), log_level="warning", access_log=False,
            ssl_certfile=str(cfg.tls_cert) if cfg.tls_cert else None,
            ssl_keyfile=str(cfg.tls_key) if cfg.tls_key else None, lifespan="off")
        rest = _EmbeddedUvicorn(ucfg)
        task = asyncio.ensure_future(rest.serve(sockets=[sock]))
        for _ in range(200):  # until uvicorn is accepting (or failed)
            if rest.started or task.done():
                break
            await asyncio.sleep(0.01)
        if task.done():
            task.result()
        log.info("SEE REST on %s:%d", host, rest_port)
        running.on_close.append(_rest_stopper(rest, task, cfg.grace_seconds))
    running.on_close.append(store.close)
    return SeeServer(grpc=running, cfg=cfg, store=store, rest_port=rest_port)


def _rest_stopper(rest: _EmbeddedUvicorn, task: asyncio.Task[None], grace: float
                  ) -> Callable[[], Awaitable[None]]:
    async def stop_rest() -> None:
        rest.should_exit = True
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(task, timeout=max(grace, 1.0) + 2)

    return stop_rest


def _die_with_parent() -> None:
    """A worker must not outlive `see serve` (even when that is SIGKILLed)."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _worker_main(cfg_json: str) -> None:
    _die_with_parent()
    logging.basicConfig(level=logging.WARNING)
    cfg = SeeConfig.model_validate_json(cfg_json)

    async def run() -> None:
        see = await start_see(cfg, shared_port=True)
        await serve_until_signalled(see.grpc, cfg.grace_seconds)

    event_loop.run(run(), cfg.event_loop)


async def serve(cfg: SeeConfig) -> None:
    """`mutualrl see serve`: run until SIGINT/SIGTERM, then drain for `grace_seconds`.

    With `workers` > 1 this process is worker 0 (gRPC + REST) and starts the others (gRPC
    only) on the same port."""
    see = await start_see(cfg, shared_port=cfg.workers > 1)
    procs: list[Any] = []
    if cfg.workers > 1:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        wcfg = cfg.model_copy(update={"port": see.grpc.port, "rest_port": None, "workers": 1,
                                      "metrics_port": None})
        for _ in range(cfg.workers - 1):
            proc = ctx.Process(target=_worker_main, args=(wcfg.model_dump_json(),))
            proc.start()
            procs.append(proc)
    if procs:
        async def stop_workers() -> None:
            for proc in procs:
                proc.terminate()  # SIGTERM: each drains like this one

        async def join_workers() -> None:
            loop = asyncio.get_running_loop()
            for proc in procs:
                await loop.run_in_executor(None, proc.join, cfg.grace_seconds + 5)
                if proc.is_alive():
                    proc.kill()

        see.grpc.on_drain.append(stop_workers)
        see.grpc.on_close.append(join_workers)
    await serve_until_signalled(
        see.grpc, cfg.grace_seconds,
        ready=f"SEE listening on {cfg.host}:{see.grpc.port} ({cfg.workers} worker(s)), REST on "
              f"{cfg.rest_host or cfg.host}:{see.rest_port}")
