"""The blocking clients' one event loop: every `SeeClient`, `ThlClient` and `MwraClient` runs its
asyncio twin's coroutines on a daemon thread's loop, so each method is written once (async).

`blocking(AsyncX.method)` makes the blocking method of a coroutine method and
`blocking_stream(AsyncX.method)` the blocking iterator of an async generator, both with the
same parameters (typed through ParamSpec). A caller's wait ends with the call: gRPC's deadline
bounds every coroutine; an exception in the caller's thread (Ctrl-C) cancels the coroutine.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import functools
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class _LoopThread:
    """One asyncio loop on a daemon thread, started on first use (and afresh in a child after
    fork(): the parent's thread does not exist there)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                started = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(started.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=run, name="mutualrl-clients",
                                                daemon=True)
                self._thread.start()
                started.wait()
                self._loop = loop
            return self._loop

    def run(self, coro: Coroutine[Any, Any, R]) -> R:
        """Run `coro` on the loop and wait for its result in this thread."""
        loop = self.loop()
        if threading.current_thread() is self._thread:
            raise RuntimeError("a blocking MutualRL client was called from its own loop; "
                               "use the asyncio client (Async*Client) there")
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def stop(self) -> None:
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)

    def forget(self) -> None:
        """In a child after fork(): the loop's thread stayed in the parent."""
        self._lock = threading.Lock()
        self._loop = self._thread = None


LOOP = _LoopThread()
atexit.register(LOOP.stop)
os.register_at_fork(after_in_child=LOOP.forget)


async def _await(aw: Awaitable[R]) -> R:
    return await aw


class Facade(Protocol):
    """What `blocking` needs of a blocking client: its asyncio twin."""

    core: Any


def blocking(method: Callable[Concatenate[Any, P], Awaitable[R]]
             ) -> Callable[Concatenate[Facade, P], R]:
    """The blocking twin of an asyncio client's coroutine method."""
    name = method.__name__

    @functools.wraps(method)
    def call(self: Facade, *args: P.args, **kwargs: P.kwargs) -> R:
        return LOOP.run(_await(getattr(self.core, name)(*args, **kwargs)))

    return call


class Stream(Iterator[T]):
    """A blocking iterator over an async generator running on the clients' loop;
    `cancel()` (or `close()`) ends it and the call behind it."""

    def __init__(self, agen: AsyncIterator[T]) -> None:
        self._agen = agen
        self._pending: concurrent.futures.Future[T] | None = None
        self._done = False

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        future = asyncio.run_coroutine_threadsafe(_await(anext(self._agen)), LOOP.loop())
        self._pending = future
        try:
            return future.result()
        except StopAsyncIteration:
            self._done = True
            raise StopIteration from None
        except BaseException:
            future.cancel()
            raise
        finally:
            self._pending = None

    def cancel(self) -> None:
        """End the stream, from any thread; a `next()` waiting in another thread raises
        `concurrent.futures.CancelledError`."""
        self._done = True
        pending = self._pending
        if pending is not None:
            pending.cancel()
        else:
            aclose = getattr(self._agen, "aclose", None)
            if aclose is not None:
                asyncio.run_coroutine_threadsafe(aclose(), LOOP.loop())

    close = cancel


def blocking_stream(method: Callable[Concatenate[Any, P], AsyncIterator[T]]
                    ) -> Callable[Concatenate[Facade, P], Stream[T]]:
    """The blocking twin of an asyncio client's async-generator method."""
    name = method.__name__

    @functools.wraps(method)
    def call(self: Facade, *args: P.args, **kwargs: P.kwargs) -> Stream[T]:
        return Stream(getattr(self.core, name)(*args, **kwargs))

    return call
