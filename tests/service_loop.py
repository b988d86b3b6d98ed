"""Servers on an event loop in a daemon thread, and the Redis clean-up after them, shared by the
tests that start real services in-process."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
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
