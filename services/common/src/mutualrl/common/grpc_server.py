"""Build, start and stop a grpc.aio server with what every MutualRL service needs:
bearer auth, grpc.health.v1, reflection, Prometheus metrics per method, optional TLS."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import Counter, Histogram, start_http_server

from mutualrl.common.auth import BearerAuthInterceptor
from mutualrl.common.config import ServiceConfig

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


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts calls by method and status code and times them."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        kwargs = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary:
            inner = handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                start, failed = time.perf_counter(), True
                try:
                    result = await inner(request, context)
                    failed = False
                    return result
                finally:
                    GRPC_SECONDS.labels(method).observe(time.perf_counter() - start)
                    GRPC_REQUESTS.labels(method, _code_name(context, failed)).inc()

            return grpc.unary_unary_rpc_method_handler(unary, **kwargs)
        if handler.unary_stream:
            inner_stream = handler.unary_stream

            async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
                start, failed = time.perf_counter(), True
                try:
                    async for item in inner_stream(request, context):
                        yield item
                    failed = False
                finally:
                    GRPC_SECONDS.labels(method).observe(time.perf_counter() - start)
                    GRPC_REQUESTS.labels(method, _code_name(context, failed)).inc()

            return grpc.unary_stream_rpc_method_handler(stream, **kwargs)
        return handler  # client-streaming RPCs are not used by MutualRL


@dataclass
class RunningServer:
    """A started server and what a caller needs to address and stop it."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    metrics_port: int | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self, grace: float | None = None) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


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
) -> RunningServer:
    """Create the server, register the servicers, health and reflection, bind and start it.

    `service_names` are full proto service names (`mutualrl.v1.ExperienceExchange`); each is
    reported SERVING by the health service once the server has started. `reuse_port` binds
    with SO_REUSEPORT so several worker processes share one port (the kernel spreads
    connections over them); otherwise a port already in use is an error.
    """
    # Metrics outermost, so refused calls are counted with their UNAUTHENTICATED code too.
    interceptors: list[grpc.aio.ServerInterceptor] = [MetricsInterceptor()]
    token = cfg.resolved_token()
    if token:
        interceptors.append(BearerAuthInterceptor(token))
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
    log.info("gRPC %s listening on %s:%d (tls=%s, auth=%s, metrics=%s)",
             ",".join(names), cfg.host, port, creds is not None, bool(token), metrics_port)
    return RunningServer(server=server, port=port, health=health_servicer,
                         metrics_port=metrics_port)


async def serve_until_signalled(running: RunningServer, grace: float,
                                on_stop: Callable[[], Awaitable[None]] | None = None) -> None:
    """Block until SIGINT/SIGTERM, then drain in-flight calls for `grace` seconds and stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    waiter = asyncio.ensure_future(running.server.wait_for_termination())
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
    log.info("stopping (grace %.1fs)", grace)
    await running.stop(grace)
    if on_stop is not None:
        await on_stop()
    stopper.cancel()
    waiter.cancel()
