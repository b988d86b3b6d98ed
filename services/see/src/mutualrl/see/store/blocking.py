"""Blocking Redis reads of one SEE process, on their own pool.

A blocked XREADGROUP holds its connection for up to 30 s. On the pool Publish uses, 80 waiting
fetches took all 64 connections and Publish failed; on a socket timeout shorter than the wait,
every long fetch failed. Here the waits have their own client, whose socket timeout covers the
longest wait the API allows, and at most `redis_max_blocking_reads` of them run at once: one
more FetchRollouts that would block is RESOURCE_EXHAUSTED at once (a Subscribe waits its turn).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from mutualrl.common.errors import ResourceExhausted


class BlockingReads:
    def __init__(self, client: Any, limit: int) -> None:
        self.r = client
        self.limit = limit
        self._slots = asyncio.Semaphore(limit)
        self.in_use = 0
        """Blocking reads waiting now."""

    @contextlib.asynccontextmanager
    async def slot(self, field: str, *, wait: bool) -> AsyncIterator[Any]:
        """A slot for one blocking read (yields the client to read with); without `wait`,
        ResourceExhausted naming `field` when every slot is taken."""
        if not wait and self._slots.locked():
            raise ResourceExhausted(field, f"{self.limit} blocking reads are already waiting on "
                                           "this SEE process; retry later or with block_ms=0")
        async with self._slots:
            self.in_use += 1
            try:
                yield self.r
            finally:
                self.in_use -= 1

    async def aclose(self) -> None:
        await self.r.aclose()
