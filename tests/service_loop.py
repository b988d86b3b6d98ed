"""Servers on an event loop in a daemon thread, and the Redis clean-up after them, shared by the
tests that start real services in-process."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


class LoopThread:
    """An event loop in a daemon thread; `run` waits for a coroutine on it."""

    def __init__(self, name: str = "services") -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self.thread.start()

    def run(self, coro: Awaitable[Any], timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def delete_keys(redis_url: str, pattern: str) -> None:
    """Delete every Redis key matching `pattern` (what a test's services or runs left)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@contextlib.contextmanager
def in_process(redis_url: str, name: str, start: Callable[[str], Awaitable[Any]]) -> Iterator[Any]:
    """A service `start(key_prefix)` starts on its own loop thread, on a private key prefix;
    yields the server, then stops it and deletes its keys."""
    loop = LoopThread(name)
    prefix = f"{name}{uuid.uuid4().hex[:10]}"
    server = loop.run(start(prefix))
    try:
        yield server
    finally:
        loop.run(server.stop(0.2))
        loop.close()
        delete_keys(redis_url, f"{prefix}:*")


@contextlib.contextmanager
def see_server(redis_url: str, name: str, rest: bool = False) -> Iterator[Any]:
    """An in-process SEE (gRPC on port 0, no auth; with `rest`, its REST app on port 0 too) on
    a private key prefix; yields its address (with `rest`, the server), then stops it and
    deletes its keys."""
    from mutualrl.see.config import SeeConfig
    from mutualrl.see.server import start_see

    with in_process(redis_url, name, lambda prefix: start_see(SeeConfig(
            redis_url=redis_url, rest_port=0 if rest else None, port=0, metrics_port=None,
            auth_token=None, grace_seconds=0.2, key_prefix=prefix))) as server:
        yield server if rest else server.address


@dataclass
class RolloutSample:
    """A rollout sample as the engines give it, written by hand."""

    token_ids: list[int]
    text: str
    offsets: list[tuple[int, int]]
    logprobs: list[float]
    finish_reason: str
    prompt_token_ids: list[int] = field(default_factory=list)
