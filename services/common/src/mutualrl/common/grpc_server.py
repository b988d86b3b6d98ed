"""The lifecycle every MutualRL service shares: build and start a grpc.aio server with bearer
auth, grpc.health.v1, reflection, Prometheus metrics per method and optional TLS
(`start_server`); serve until SIGINT/SIGTERM (`serve_until_signalled`); stop gracefully, once
(`RunningServer.stop`)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import Counter, Histogram, start_http_server

from mutualrl.common.auth import BearerAuthInterceptor, Rules
from mutualrl.common.config import ServiceConfig
from mutualrl.common.event_loop import running_loop_name
from mutualrl.common.handlers import HandlerInterceptor
from mutualrl.common.request_parsing import RequestParsingInterceptor

log = logging.getLogger(__name__)

GRPC_REQUESTS = Counter(
    "mutualrl_grpc_requests", "gRPC calls handled, by full method name and status code.",
    ["method", "code"],
)
GRPC_SECONDS = Histogram(
    "mutualrl_grpc_request_seconds", "Handling time of gRPC calls (streams: until they end).",
    ["method"], buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                         10, 30),
)


def _code_name(context: grpc.aio.ServicerContext, failed: bool) -> str:
    code = context.code()
    if code is None:
        return "UNKNOWN" if failed else "OK"
    return code.name if isinstance(code, grpc.StatusCode) else str(code)


@dataclass
class _Call:
    """One handled call's outcome while it runs: failed until its handler returns."""

    failed: bool = True


@contextlib.contextmanager
def _measured(method: str, context: grpc.aio.ServicerContext) -> Iterator[_Call]:
    start, call = time.perf_counter(), _Call()
    try:
        yield call
    finally:
        GRPC_SECONDS.labels(method).observe(time.perf_counter() - start)
        GRPC_REQUESTS.labels(method, _code_name(context, call.failed)).inc()


class MetricsInterceptor(HandlerInterceptor):
    """Counts calls by method and status code and times them."""

    def wrap(self, handler: grpc.RpcMethodHandler,
             details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = details.method
        kwargs = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary:
            inner = handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                with _measured(method, context) as call:
                    result = await inner(request, context)
                    call.failed = False
                    return result

            return grpc.unary_unary_rpc_method_handler(unary, **kwargs)
        if handler.unary_stream:
            inner_stream = handler.unary_stream
            if not inspect.isasyncgenfunction(inner_stream):
                # Writes through context.write (grpc.health.v1 Watch): wrap as a coroutine.

                async def writer(request: Any, context: grpc.aio.ServicerContext) -> None:
                    with _measured(method, context) as call:
                        await inner_stream(request, context)
                        call.failed = False

                return grpc.unary_stream_rpc_method_handler(writer, **kwargs)

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                with _measured(method, context) as call:
                    async for item in inner_stream(request, context):
                        yield item
                    call.failed = False

            return grpc.unary_stream_rpc_method_handler(stream, **kwargs)
        if handler.stream_unary:
            # THL's Retokenize / AlignTrace: unary on the wire, read by the handler itself.
            inner_reader = handler.stream_unary

            async def reader(requests: Any, context: grpc.aio.ServicerContext) -> Any:
                with _measured(method, context) as call:
                    result = await inner_reader(requests, context)
                    call.failed = False
                    return result

            return grpc.stream_unary_rpc_method_handler(reader, **kwargs)
        return handler  # client-and-server-streaming RPCs are not used by MutualRL


Hook = Callable[[], Awaitable[None]]


@dataclass
class RunningServer:
    """A started server, what a caller needs to address it, and its one way to stop.

    Every service stops the same way (`stop`): health turns NOT_SERVING (watchers and load
    balancers stop sending), the `on_drain` hooks end long-lived work (streams, waits), calls in
    flight get `grace` seconds, then the `on_close` hooks release what the service holds
    (stores, locks), in order. Stopping twice, or from two tasks at once, does it once."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    metrics_port: int | None = None
    on_drain: list[Hook] = field(default_factory=list)
    """Run once health says NOT_SERVING, before the drain (end streams and waits)."""
    on_close: list[Hook] = field(default_factory=list)
    """Run after the server has stopped, in order (close stores, release locks)."""
    _stopping: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def stopped(self) -> bool:
        """True once a stop has completed."""
        return self._stopping is not None and self._stopping.done()

    async def stop(self, grace: float | None = None) -> None:
        """Stop gracefully (see the class docstring); later calls wait for the first one."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop(grace))
        await asyncio.shield(self._stopping)

    async def _stop(self, grace: float | None) -> None:
        await self.health.enter_graceful_shutdown()
        await _run_hooks(self.on_drain, "drain")
        await self.server.stop(grace)
        await _run_hooks(self.on_close, "close")


@dataclass
class ServiceServer:
    """What `start_see`, `start_thl` and `start_mwra` return: the gRPC server with its lifecycle
    (`grpc`), plus each service's own parts (fields of the subclasses)."""

    grpc: RunningServer

    @property
    def address(self) -> str:
        return self.grpc.address

    @property
    def port(self) -> int:
        return self.grpc.port

    async def stop(self, grace: float | None = None) -> None:
        """`RunningServer.stop`: graceful, done once however often it is called."""
        await self.grpc.stop(grace)


async def _run_hooks(hooks: list[Hook], stage: str) -> None:
    for hook in hooks:
        try:
            await hook()
        except Exception:  # one failing hook must not keep the others from releasing theirs
            log.exception("%s hook %s failed", stage, getattr(hook, "__qualname__", hook))


def _server_credentials(cfg: ServiceConfig) -> grpc.ServerCredentials | None:
    if cfg.tls_cert is None and cfg.tls_key is None:
        return None
    if cfg.tls_cert is None or cfg.tls_key is None:
        raise ValueError("tls_cert and tls_key must be given together")
    return grpc.ssl_server_credentials([(cfg.tls_key.read_bytes(), cfg.tls_cert.read_bytes())])


async def start_server(
    cfg: ServiceConfig,
    add_servicers: Callable[[grpc.aio.Server], None],
    service_names: Iterable[str],
    reuse_port: bool = False,
    access: Rules | None = None,
) -> RunningServer:
    """Create the server, register the servicers, health and reflection, bind and start it.

    `service_names` are full proto service names (`mutualrl.v1.ExperienceExchange`); each is
    reported SERVING by the health service once the server has started. `reuse_port` binds
    with SO_REUSEPORT so several worker processes share one port (the kernel spreads
    connections over them); otherwise a port already in use is an error. `access` says which
    methods the read and policy tokens derived from the auth token may call
    (`mutualrl.common.auth`); unlisted methods are for the token itself.
    """
    # Metrics outermost, so refused calls are counted with their UNAUTHENTICATED code too;
    # parsing innermost, so auth's refusal also gets a deserializer that never raises.
    interceptors: list[grpc.aio.ServerInterceptor] = [MetricsInterceptor()]
    token = cfg.resolved_token()
    if token:
        interceptors.append(BearerAuthInterceptor(token, rules=access))
    interceptors.append(RequestParsingInterceptor())
    options = [
        ("grpc.max_receive_message_length", cfg.max_message_bytes),
        ("grpc.max_send_message_length", cfg.max_message_bytes),
        ("grpc.so_reuseport", int(reuse_port)),
    ]
    server = grpc.aio.server(interceptors=interceptors, options=options)
    add_servicers(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = list(service_names)
    reflection.enable_server_reflection(
        [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
         reflection.SERVICE_NAME],
        server,
    )
    bind = f"{cfg.host}:{cfg.port}"
    creds = _server_credentials(cfg)
    port = server.add_secure_port(bind, creds) if creds else server.add_insecure_port(bind)
    if port == 0:
        raise OSError(f"could not bind gRPC server to {bind}")
    await server.start()
    for name in ["", *names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    metrics_port = None
    if cfg.metrics_port is not None:
        http_server, _ = start_http_server(cfg.metrics_port, addr=cfg.host)
        metrics_port = http_server.server_port
    log.info("gRPC %s listening on %s:%d (tls=%s, auth=%s, metrics=%s, loop=%s)",
             ",".join(names), cfg.host, port, creds is not None, bool(token), metrics_port,
             running_loop_name())
    return RunningServer(server=server, port=port, health=health_servicer,
                         metrics_port=metrics_port)


async def wait_for_signal(*also: asyncio.Future[Any]) -> int | None:
    """Block until SIGINT or SIGTERM (returns its number) or until one of the futures `also`
    is done (returns None; they are left running). The handlers are removed before returning."""
    loop = asyncio.get_running_loop()
    stop: asyncio.Future[int] = loop.create_future()

    def received(sig: int) -> None:
        if not stop.done():
            stop.set_result(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, received, sig)
    try:
        await asyncio.wait({stop, *also}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return stop.result() if stop.done() else None


# Young-generation collections every this many container allocations instead of CPython's
# 700: a Publish of 4,096 records allocates that many tuples and lists in a few milliseconds.
_GC_GEN0_THRESHOLD = 20_000


def settle_heap() -> None:
    """Set the garbage collector for a long-running service: what start-up left alive (modules,
    pydantic models, protobuf descriptors: hundreds of thousands of objects that live as long as
    the process) is moved out of the collector's view with `gc.freeze()`, so a full collection
    no longer walks all of it again, and young collections run less often. Cycles are still
    collected; only what existed before this call is never examined again."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(_GC_GEN0_THRESHOLD, gen1, gen2)


async def serve_until_signalled(running: RunningServer, grace: float,
                                ready: str | None = None) -> None:
    """The serving loop of every `mutualrl <service> serve`: print `ready` (the line people and
    supervisors wait for), block until SIGINT/SIGTERM or until the server terminates, then
    `running.stop(grace)`."""
    if ready is not None:
        print(ready, flush=True)
    settle_heap()
    # Cancelled only after the stop: cancelling grpc's wait_for_termination earlier would
    # cancel the shutdown it shares.
    terminated = asyncio.ensure_future(running.server.wait_for_termination())
    sig = await wait_for_signal(terminated)
    log.info("%s: stopping (grace %.1fs)",
             signal.Signals(sig).name if sig is not None else "server terminated", grace)
    await running.stop(grace)
    terminated.cancel()
