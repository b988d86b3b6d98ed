"""The event loop a service runs on (`event_loop` in every service's config).

uvloop (libuv, in C) where it is installed, else asyncio's own loop. A service's hot path is
socket I/O driven by the loop: gRPC's completions handed to the loop, redis-py's reads and
writes. Under SEE's Publish benchmark the server process spent about 15 % less CPU per record on
uvloop than on asyncio's selector loop (`mutualrl bench see`, docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")

EventLoopKind = Literal["auto", "uvloop", "asyncio"]
"""`auto`: uvloop when importable, else asyncio; `uvloop`: uvloop or a clear error;
`asyncio`: the standard library's loop."""


def run(main: Coroutine[Any, Any, T], kind: EventLoopKind = "auto") -> T:
    """Run `main` to completion on a new loop of `kind` (as `asyncio.run` does)."""
    if kind != "asyncio":
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                main.close()
                raise RuntimeError("event_loop is 'uvloop' but uvloop is not installed "
                                   "(pip install uvloop; or set event_loop: auto)") from None
        else:
            return uvloop.run(main)
    return asyncio.run(main)


def running_loop_name() -> str:
    """`uvloop` or `asyncio`: the loop the caller runs on."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") \
        else "asyncio"
