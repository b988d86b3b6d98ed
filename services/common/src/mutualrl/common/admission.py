"""The request bytes one service process holds at once (`BytesBudget`), and each method's
largest request (`RequestLimits`).

The shared server (`mutualrl.common.grpc_server`) takes a call's share of the budget before it
reads the call's body: the method's largest request, given back down to the body's length once
it is read, the rest when the call's answer has been sent. A call that does not fit beside the
calls held waits in arrival order up to `wait_seconds`, then is RESOURCE_EXHAUSTED with the
budget named; one call alone always runs. So what the service receives, parses and works on
at once is bounded by the budget, whoever sends what.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Mapping
from dataclasses import dataclass, field

from mutualrl.common.errors import ResourceExhausted


@dataclass(frozen=True)
class RequestLimits:
    """The largest request body each method accepts, in bytes: `methods` (full paths) for the
    methods whose requests may be large, `default` for every other."""

    default: int
    methods: Mapping[str, int] = field(default_factory=dict)

    def of(self, method: str) -> int:
        return self.methods.get(method, self.default)

    @property
    def largest(self) -> int:
        """What the transport must let through (gRPC's receive limit is one per server)."""
        return max([self.default, *self.methods.values()])


class BytesBudget:
    """At most `limit` bytes held at once by the calls admitted (one call alone always)."""

    def __init__(self, limit: int, wait_seconds: float, service: str) -> None:
        self.limit = limit
        self.wait_seconds = wait_seconds
        self.service = service
        self.in_use = 0
        self.peak = 0
        """The most held at once since start."""
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = (
            collections.deque())

    def _fits(self, size: int) -> bool:
        return self.in_use == 0 or self.in_use + size <= self.limit

    async def acquire(self, size: int) -> None:
        """Hold `size` bytes (`release` gives them back): at once when they fit and nobody
        waits, else after waiting in line up to `wait_seconds`; ResourceExhausted then."""
        if not self._waiting and self._fits(size):
            self._take(size)
            return
        turn = asyncio.get_running_loop().create_future()
        entry = (size, turn)
        self._waiting.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(turn), self.wait_seconds)
        except (TimeoutError, asyncio.CancelledError) as err:
            if turn.done() and not turn.cancelled():
                self.release(size)  # admitted just as it gave up
            else:
                turn.cancel()
                self._waiting.remove(entry)
                self._admit()
            if isinstance(err, asyncio.CancelledError):
                raise
            raise self.full(size) from None

    def release(self, size: int) -> None:
        self.in_use -= size
        self._admit()

    def full(self, size: int) -> ResourceExhausted:
        return ResourceExhausted("request", (
            f"a request of up to {size} B does not fit: this {self.service} process holds "
            f"{self.in_use} B of requests (at most {self.limit} B at once, "
            f"max_inflight_request_bytes) and waited {self.wait_seconds:g} s "
            "(request_wait_seconds); retry later"))

    def _take(self, size: int) -> None:
        self.in_use += size
        self.peak = max(self.peak, self.in_use)

    def _admit(self) -> None:
        while self._waiting:
            size, turn = self._waiting[0]
            if not self._fits(size):
                return
            self._waiting.popleft()
            self._take(size)
            turn.set_result(None)
