"""The lifecycle every MutualRL service shares: build and start a grpc.aio server with bearer
auth and a bytes budget decided before any body is read (`Gate`), grpc.health.v1, reflection,
Prometheus metrics per method and optional TLS (`start_server`); serve until SIGINT/SIGTERM
(`serve_until_signalled`); stop gracefully, once (`RunningServer.stop`)."""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import signal
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import Counter, Gauge, Histogram, start_http_server

from mutualrl.common import memory
from mutualrl.common.admission import BytesBudget, RequestLimits
from mutualrl.common.auth import BodyCheck, Rules, Trust
from mutualrl.common.config import ServiceConfig
from mutualrl.common.errors import InvalidArgument, ResourceExhausted, ServiceError
from mutualrl.common.event_loop import running_loop_name
from mutualrl.common.request_parsing import UnparsableRequest, parse

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


REQUEST_BODIES = Counter(
    "mutualrl_grpc_request_bodies",
    "Request bodies read off the wire (stage=read) and parsed (stage=parsed), by full method "
    "name; a call refused on its credentials or for room reads none.", ["method", "stage"],
)
INFLIGHT_REQUEST_BYTES = Gauge(
    "mutualrl_grpc_inflight_request_bytes",
    "Request bytes the calls admitted hold now (max_inflight_request_bytes), by service.",
    ["service"],
)

Behaviour = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
"""What the gate registers for every method: reads its request itself (from the request
iterator grpc gives a client-streaming handler) and returns the answer, or writes a stream's
messages through `context.write` and returns None."""


def _code_name(context: grpc.aio.ServicerContext, failed: bool) -> str:
    code = context.code()
    if code is None:
        return "UNKNOWN" if failed else "OK"
    return code.name if isinstance(code, grpc.StatusCode) else str(code)


def _measured(method: str, behaviour: Behaviour) -> Behaviour:
    """`behaviour`, counted by method and status code and timed (streams: until they end)."""

    async def measured(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        start, failed = time.perf_counter(), True
        try:
            result = await behaviour(requests, context)
            failed = False
            return result
        finally:
            GRPC_SECONDS.labels(method).observe(time.perf_counter() - start)
            GRPC_REQUESTS.labels(method, _code_name(context, failed)).inc()

    return measured


async def _respond(inner: Any, request: Any, context: grpc.aio.ServicerContext,
                   streaming: bool) -> Any:
    """`inner`'s answer to `request`; a stream's messages written through `context.write`
    (from an async generator, or by `inner` itself: grpc.health.v1 Watch)."""
    if not streaming:
        return await inner(request, context)
    if inspect.isasyncgenfunction(inner):
        async for item in inner(request, context):
            await context.write(item)
    else:
        await inner(request, context)
    return None


def _forget_frames(err: BaseException) -> None:
    """Drop the locals of the finished frames `err` (and what it chains) passes through: a
    traceback kept anywhere, or one in a reference cycle waiting for the collector, would
    otherwise keep the request those frames held."""
    seen: BaseException | None = err
    for _ in range(8):
        if seen is None:
            return
        traceback.clear_frames(seen.__traceback__)
        seen = seen.__cause__ or seen.__context__


@dataclass
class _Held:
    """A call's share of its service's bytes budget, and the size of its body once read."""

    size: int
    read: int = 0


class Gate(grpc.aio.ServerInterceptor):
    """What every call of every method meets before its body is read or parsed, in order:

    1. its credentials, from its metadata alone (`Trust`; a policy token's call names the
       policy it acts for there): refused UNAUTHENTICATED or PERMISSION_DENIED by a handler
       that never reads the body, which the transport then never receives;
    2. room for it in the service's bytes budget (`BytesBudget`): the method's largest request
       (`RequestLimits`) is held before the body is read, then the body's length;
       RESOURCE_EXHAUSTED naming the budget after a brief wait;
    3. the body's length against the method's largest request (RESOURCE_EXHAUSTED naming it),
       and, for a method a policy calls for itself, the policies it names, read from its tags
       and lengths: any but the one its metadata names is PERMISSION_DENIED;
    4. only then is the body parsed (INVALID_ARGUMENT naming the message type when it does not
       parse) and handed to the method (SEE's Publish and THL's Retokenize and AlignTrace take
       the bytes and parse them as they go).

    Every method is registered here as reading its request itself, so none of this waits for
    grpc to receive and deserialize the body first. The call's share is held until its answer
    is sent; after a large one the allocator hands freed pages back (`memory.trim`). Every
    call is counted by method and status code and timed."""

    def __init__(self, trust: Trust, budget: BytesBudget, limits: RequestLimits) -> None:
        self.trust = trust
        self.budget = budget
        self.limits = limits

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method or "?"
        try:
            check = self.trust.decide(method, handler_call_details.invocation_metadata or ())
        except ServiceError as refusal:
            return _registered(handler, method, _refusing(refusal))
        if handler.request_streaming:  # reflection: small requests it reads itself
            return _registered(handler, method, _passing(handler), handler.request_deserializer)
        return _registered(handler, method, self._gated(handler, method, check))

    def _gated(self, handler: grpc.RpcMethodHandler, method: str,
               check: BodyCheck | None) -> Behaviour:
        inner = handler.unary_stream if handler.response_streaming else handler.unary_unary
        deserializer = handler.request_deserializer
        limit, streaming = self.limits.of(method), handler.response_streaming

        async def gated(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            data: bytes | None = None
            request: Any = None
            try:
                data = await self._read(context, method, limit)
                if check is not None:
                    check(data)
                if deserializer is None:
                    request, data = data, None
                else:
                    REQUEST_BODIES.labels(method, "parsed").inc()
                    request, data = parse(method, deserializer, data), None
                    if isinstance(request, UnparsableRequest):
                        raise InvalidArgument("", request.message)
                return await _respond(inner, request, context, streaming)
            except ServiceError as err:
                _forget_frames(err)
                data = request = None  # before the abort's traceback takes this frame
                await context.abort(err.code, str(err))
            except BaseException as err:
                _forget_frames(err)
                raise
            finally:
                data = request = None

        return gated

    async def _read(self, context: grpc.aio.ServicerContext, method: str, limit: int) -> bytes:
        """The call's body, read once its share of the budget is held (see the class)."""
        await self.budget.acquire(limit)
        held = _Held(limit)
        loop = asyncio.get_running_loop()
        context.add_done_callback(lambda _: loop.call_soon_threadsafe(self._done, held))
        data = await context.read()
        if not isinstance(data, bytes):  # the client half-closed without a message
            raise InvalidArgument("request", "no request message")
        REQUEST_BODIES.labels(method, "read").inc()
        held.read = len(data)
        if held.read > limit:
            raise ResourceExhausted("request", f"{held.read} B, over the {limit} B limit of "
                                    f"{method} requests")
        self.budget.release(held.size - held.read)
        held.size = held.read
        return data

    def _done(self, held: _Held) -> None:
        self.budget.release(held.size)
        if held.read >= memory.TRIM_AFTER_BYTES:
            memory.trim()


def _registered(handler: grpc.RpcMethodHandler, method: str, behaviour: Behaviour,
                deserializer: Callable[[bytes], Any] | None = None) -> grpc.RpcMethodHandler:
    """`behaviour` (measured) registered as reading its request itself, answering as
    `handler` does."""
    register = (grpc.stream_stream_rpc_method_handler if handler.response_streaming
                else grpc.stream_unary_rpc_method_handler)
    return register(_measured(method, behaviour), request_deserializer=deserializer,
                    response_serializer=handler.response_serializer)


def _refusing(refusal: ServiceError) -> Behaviour:
    code, details = refusal.code, str(refusal)

    async def refuse(requests: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, details)

    return refuse


def _passing(handler: grpc.RpcMethodHandler) -> Behaviour:
    inner = handler.stream_stream if handler.response_streaming else handler.stream_unary

    async def passing(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        return await _respond(inner, requests, context, handler.response_streaming)

    return passing


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
    budget: BytesBudget | None = None
    """The request bytes its calls hold (`Gate`)."""
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
    large_requests: Mapping[str, int] | None = None,
) -> RunningServer:
    """Create the server, register the servicers, health and reflection, bind and start it.

    `service_names` are full proto service names (`mutualrl.v1.ExperienceExchange`); each is
    reported SERVING by the health service once the server has started. `reuse_port` binds
    with SO_REUSEPORT so several worker processes share one port (the kernel spreads
    connections over them); otherwise a port already in use is an error. `access` says which
    methods the read and policy tokens derived from the auth token may call
    (`mutualrl.common.auth`); unlisted methods are for the token itself. `large_requests`
    (full method path -> bytes, at most `max_message_bytes`) names the methods whose requests
    may be larger than `max_request_bytes`, every other method's largest. Every call passes
    the `Gate`.
    """
    names = list(service_names)
    limits = request_limits(cfg, large_requests or {})
    label = names[0].rpartition(".")[2] if names else "gRPC"
    budget = BytesBudget(cfg.max_inflight_request_bytes, cfg.request_wait_seconds, label)
    INFLIGHT_REQUEST_BYTES.labels(label).set_function(lambda: budget.in_use)
    token = cfg.resolved_token()
    interceptors = [Gate(Trust(token, access), budget, limits)]
    options = [
        ("grpc.max_receive_message_length", limits.largest),
        ("grpc.max_send_message_length", cfg.max_message_bytes),
        ("grpc.so_reuseport", int(reuse_port)),
        # The transport buffers a stream's body up to its flow-control window before anyone
        # reads it; bandwidth probing grows that window to megabytes, so a call the gate
        # refuses unread would still cost them. At the fixed window a large accepted body
        # takes a few more round trips.
        ("grpc.http2.bdp_probe", 0),
    ]
    server = grpc.aio.server(interceptors=interceptors, options=options)
    add_servicers(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
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
                         metrics_port=metrics_port, budget=budget)


def request_limits(cfg: ServiceConfig, large_requests: Mapping[str, int]) -> RequestLimits:
    """Each method's largest request: its own for `large_requests`, `max_request_bytes` for
    every other, none above `max_message_bytes`."""
    most = cfg.max_message_bytes
    return RequestLimits(default=min(cfg.max_request_bytes, most),
                         methods={m: min(n, most) for m, n in large_requests.items()})


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
    supervisors wait for), set the collector and the allocator for a long-running service
    (`settle_heap`, `memory.settle`), block until SIGINT/SIGTERM or until the server
    terminates, then `running.stop(grace)`."""
    if ready is not None:
        print(ready, flush=True)
    settle_heap()
    memory.settle()
    # Cancelled only after the stop: cancelling grpc's wait_for_termination earlier would
    # cancel the shutdown it shares.
    terminated = asyncio.ensure_future(running.server.wait_for_termination())
    sig = await wait_for_signal(terminated)
    log.info("%s: stopping (grace %.1fs)",
             signal.Signals(sig).name if sig is not None else "server terminated", grace)
    await running.stop(grace)
    terminated.cancel()
