"""What every MutualRL client shares: one constructor shape, the channel, retries, closing.

    SeeClient()                                   # the service's default local address
    SeeClient("see:50051")                        # an address
    SeeClient("see:50051", token="...", timeout=5)
    SeeClient(ClientOptions(address="see:50051", tls_ca=Path("ca.pem")), outage_budget=0)

`SeeClient`, `ThlClient` and `MwraClient` (and their asyncio twins `AsyncSeeClient`,
`AsyncThlClient`, `AsyncMwraClient`) all take `(target, **overrides)`: `target` is a
`ClientOptions`, an address or None, and keyword overrides are fields of `ClientOptions`.
Each exposes `options` (the resolved `ClientOptions`) and `stub` (the generated gRPC stub, for
calls that need their own per-call timeout or metadata), and has `delete_run(run_id)` (the
DeleteRun every service answers, runs.proto). Every call retries UNAVAILABLE with backoff for
as long as `ClientOptions.outage_budget` (`mutualrl.common.channel`): a service that restarts
costs the caller a delay, not an error. Each attempt gets the call's full deadline. An outage
is logged once when it starts and once when the service answers again (logger
`mutualrl.client`, with its length).

Each method is written once, in the asyncio client; the blocking client is its facade
(`Client`): it runs the asyncio client on one background loop (`mutualrl.client.blocking`)
and declares each method as `name = blocking(AsyncX.name)`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar, Generic, Self, TypeVar

import grpc

from mutualrl.client.blocking import LOOP, blocking
from mutualrl.common.channel import ClientOptions, Outage, aio_channel, sync_channel
from mutualrl.v1 import runs_pb2

Target = ClientOptions | str | None
"""What a client constructor takes first: options, an address ("host:port"), or None."""
T = TypeVar("T")
log = logging.getLogger("mutualrl.client")


class OutageLog:
    """One client's outages, logged once each: when a call first finds the service away and
    when one gets an answer again (with how long that took)."""

    def __init__(self, service: str, address: str) -> None:
        self.service, self.address = service, address
        self.down_since: float | None = None
        self.outages: list[float] = []
        """Seconds each past outage lasted, first UNAVAILABLE to the next answer."""

    def failed(self, err: grpc.RpcError, budget: float) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
            log.warning("%s at %s unavailable (%s); retrying for up to %g s", self.service,
                        self.address, err.details(), budget)

    def answered(self) -> None:
        if self.down_since is not None:
            lasted = time.monotonic() - self.down_since
            self.down_since = None
            self.outages.append(lasted)
            log.warning("%s at %s answers again after %.1f s", self.service, self.address,
                        lasted)


async def retrying(attempt: Callable[[], Awaitable[T]], options: ClientOptions,
                   outages: OutageLog | None = None, budget: float | None = None) -> T:
    """`await attempt()` until it answers, retrying UNAVAILABLE within the outage budget
    (`budget`, else the options')."""
    outage = Outage(options, budget)
    while True:
        try:
            out = await attempt()
        except grpc.RpcError as err:
            delay = outage.retry_in(err.code())
            if delay is None:
                raise outage.exhausted(err) from err
            if outages is not None:
                outages.failed(err, outage.budget)
            await asyncio.sleep(delay)
            continue
        if outages is not None:
            outages.answered()
        return out


def retrying_blocking(attempt: Callable[[], T], options: ClientOptions) -> T:
    """`retrying` for a blocking call."""
    outage = Outage(options)
    while True:
        try:
            return attempt()
        except grpc.RpcError as err:
            delay = outage.retry_in(err.code())
            if delay is None:
                raise outage.exhausted(err) from err
            time.sleep(delay)


def resolve_options(target: Target, default_address: str, overrides: dict[str, Any]
                    ) -> ClientOptions:
    """The `ClientOptions` a client uses (overrides validated like the fields themselves)."""
    if isinstance(target, ClientOptions):
        base = target.model_dump(exclude_unset=True)
    elif isinstance(target, str):
        base = {"address": target}
    elif target is None:
        base = {"address": default_address}
    else:
        raise TypeError(f"a client's target is ClientOptions, an address or None, "
                        f"not {type(target).__name__}")
    return ClientOptions.model_validate({**base, **overrides})


class AsyncClient:
    """Base of the asyncio clients: a grpc.aio channel, `await close()`, `async with`."""

    default_address: ClassVar[str] = "127.0.0.1:50051"
    service: ClassVar[str] = "service"
    """The service's name in log lines (SEE, THL, MWRA)."""

    def __init__(self, target: Target = None, **overrides: Any) -> None:
        self.options = resolve_options(target, self.default_address, overrides)
        self.channel: grpc.aio.Channel = aio_channel(self.options)
        self.stub: Any = None
        """The service's generated stub (set by the subclass)."""
        self.outages = OutageLog(self.service, self.options.address)

    async def delete_run(self, run_id: str) -> int:
        """Remove everything the service holds of the run; returns what it removed (Redis keys;
        THL: registrations). NOT_FOUND when it holds nothing."""
        reply = await self._call(self.stub.DeleteRun, runs_pb2.DeleteRunRequest(run_id=run_id))
        return int(reply.deleted)

    async def _call(self, method: Any, request: Any, timeout: float | None = None,
                    outage_budget: float | None = None) -> Any:
        """One unary RPC (`method` a stub attribute) with the options' token and deadline;
        `timeout` replaces the deadline of each attempt (server-side waits add their wait to
        it). UNAVAILABLE is retried within `outage_budget`, else the options' budget."""
        opts = self.options
        deadline = opts.timeout if timeout is None else timeout
        return await retrying(
            lambda: method(request, timeout=deadline, metadata=opts.metadata()), opts,
            self.outages, outage_budget)

    async def _stream(self, open_call: Callable[[], Any],
                      seen: Callable[[Any], None] | None = None) -> AsyncIterator[Any]:
        """The messages of a server stream `open_call()` opens, re-opened after UNAVAILABLE
        within the outage budget; `seen` is told each message before it is yielded (where a
        re-opened stream should start)."""
        outage = Outage(self.options)
        while True:
            call = open_call()
            try:
                async for msg in call:
                    outage.reset()
                    self.outages.answered()
                    if seen is not None:
                        seen(msg)
                    yield msg
                return
            except grpc.aio.AioRpcError as err:
                delay = outage.retry_in(err.code())
                if delay is None:
                    raise outage.exhausted(err) from err
                self.outages.failed(err, outage.budget)
                await asyncio.sleep(delay)
            finally:
                call.cancel()

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


Core = TypeVar("Core", bound=AsyncClient)


class Client(Generic[Core]):
    """Base of the blocking clients: the facade of an asyncio client (`core`, named with the
    service's stub in the class line), `close()` and the context manager. `channel` and `stub`
    are a blocking channel of the same options and the service's stub on it, made on first
    use, for raw calls."""

    core_class: ClassVar[type[AsyncClient]]
    stub_class: ClassVar[Any]

    def __init_subclass__(cls, core: type[AsyncClient] | None = None, stub: Any = None,
                          **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if core is not None:
            cls.core_class, cls.stub_class = core, stub

    def __init__(self, target: Target = None, **overrides: Any) -> None:
        self.options = resolve_options(target, self.core_class.default_address, overrides)
        self.core: Core = LOOP.run(self._make_core())
        self._channel: grpc.Channel | None = None

    async def _make_core(self) -> Core:
        # On the loop: a grpc.aio channel belongs to the loop it is made on.
        return self.core_class(self.options)  # type: ignore[return-value]

    @property
    def outages(self) -> OutageLog:
        """The outages its calls have ridden out (`OutageLog`)."""
        return self.core.outages

    @property
    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = sync_channel(self.options)
        return self._channel

    @property
    def stub(self) -> Any:
        return self.stub_class(self.channel)

    def _call(self, method: Any, request: Any, timeout: float | None = None) -> Any:
        """A raw unary call on `stub` with the options' token and deadline, UNAVAILABLE
        retried within the outage budget."""
        opts = self.options
        deadline = opts.timeout if timeout is None else timeout
        return retrying_blocking(
            lambda: method(request, timeout=deadline, metadata=opts.metadata()), opts)

    delete_run = blocking(AsyncClient.delete_run)

    def close(self) -> None:
        LOOP.run(self.core.close())
        if self._channel is not None:
            self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
