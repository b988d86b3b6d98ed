"""What every MutualRL client shares: one constructor shape, the channel, retries, closing.

    SeeClient()                                   # the service's default local address
    SeeClient("see:50051")                        # an address
    SeeClient("see:50051", token="...", timeout=5)
    SeeClient(ClientOptions(address="see:50051", tls_ca=Path("ca.pem")), retries=0)

`SeeClient`, `ThlClient` and `MwraClient` (and their asyncio twins `AsyncSeeClient`,
`AsyncThlClient`, `AsyncMwraClient`) all take `(target, **overrides)`: `target` is a
`ClientOptions`, an address or None, and keyword overrides are fields of `ClientOptions`.
Each exposes `options` (the resolved `ClientOptions`) and `stub` (the generated gRPC stub, for
calls that need their own per-call timeout or metadata), and has `delete_run(run_id)` (the
DeleteRun every service answers, runs.proto). Unary calls retry UNAVAILABLE through gRPC's retry
policy (`ClientOptions.retries`), all attempts within the call's one deadline.

Each method is written once, in the asyncio client; the blocking client is its facade
(`Client`): it runs the asyncio client on one background loop (`mutualrl.client.blocking`)
and declares each method as `name = blocking(AsyncX.name)`.
"""

from __future__ import annotations

from typing import Any, ClassVar, Generic, Self, TypeVar

import grpc

from mutualrl.client.blocking import LOOP, blocking
from mutualrl.common.channel import ClientOptions, aio_channel, sync_channel
from mutualrl.v1 import runs_pb2

Target = ClientOptions | str | None
"""What a client constructor takes first: options, an address ("host:port"), or None."""


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

    def __init__(self, target: Target = None, **overrides: Any) -> None:
        self.options = resolve_options(target, self.default_address, overrides)
        self.channel: grpc.aio.Channel = aio_channel(self.options)
        self.stub: Any = None
        """The service's generated stub (set by the subclass)."""

    async def delete_run(self, run_id: str) -> int:
        """Remove everything the service holds of the run; returns what it removed (Redis keys;
        THL: registrations). NOT_FOUND when it holds nothing."""
        reply = await self._call(self.stub.DeleteRun, runs_pb2.DeleteRunRequest(run_id=run_id))
        return int(reply.deleted)

    async def _call(self, method: Any, request: Any, timeout: float | None = None) -> Any:
        """One unary RPC (`method` a stub attribute) with the options' token and deadline;
        `timeout` replaces the deadline (server-side waits add their wait to it). The channel
        retries UNAVAILABLE within that one deadline."""
        opts = self.options
        deadline = opts.timeout if timeout is None else timeout
        return await method(request, timeout=deadline, metadata=opts.metadata())

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
    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = sync_channel(self.options)
        return self._channel

    @property
    def stub(self) -> Any:
        return self.stub_class(self.channel)

    def _call(self, method: Any, request: Any, timeout: float | None = None) -> Any:
        """A raw unary call on `stub` with the options' token and deadline."""
        return method(request, timeout=self.options.timeout if timeout is None else timeout,
                      metadata=self.options.metadata())

    delete_run = blocking(AsyncClient.delete_run)

    def close(self) -> None:
        LOOP.run(self.core.close())
        if self._channel is not None:
            self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
