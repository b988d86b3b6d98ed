"""Handing freed memory back to the OS, the same way in every service (glibc's allocator).

A service that receives, parses and answers tens of MB at a time would otherwise keep each
thread's high-water mark: glibc raises its mmap threshold to the largest block freed so far (up
to 32 MiB), after which a request's bytes, an answer's and large arrays are carved from the
heaps of whichever threads touched them and stay resident after they are freed; and every
thread that allocates may get an arena of its own (up to 8 per core), each keeping its free
pages. `settle` fixes both once at start-up (`mutualrl <service> serve`), `trim` hands the free
pages of every arena back after large work (the shared server does after each call whose
request was large, accepted or refused; THL also after each large item). Not glibc (musl,
macOS): nothing to do.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from typing import Any

TRIM_AFTER_TOKENS = 64 * 1024
"""An item of at least this many tokens is trimmed after."""
TRIM_AFTER_BYTES = 256 * 1024
"""A call whose request held at least this many bytes is trimmed after."""
MMAP_THRESHOLD = 1 << 20
"""Allocations of at least this many bytes get their own pages (`settle`)."""
ARENA_MAX = 2
"""malloc arenas at most (`settle`): the event loop's thread and the worker threads share
them, so freed memory is found again instead of being kept per thread."""

_M_MMAP_THRESHOLD = -3  # mallopt parameters of glibc's malloc.h
_M_ARENA_MAX = -8


def _libc() -> Any | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim  # noqa: B018 (glibc only: musl and macOS have none)
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()
_MALLOC_TRIM: Callable[[int], int] | None = _LIBC.malloc_trim if _LIBC is not None else None


def settle() -> None:
    """Set the allocator for a long-running service: allocations of `MMAP_THRESHOLD` bytes
    or more get their own pages, returned to the OS when freed, and threads share at most
    `ARENA_MAX` arenas (as MALLOC_ARENA_MAX would, but without relying on the environment the
    process was started with)."""
    if _LIBC is None:
        return
    _LIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    _LIBC.mallopt(_M_ARENA_MAX, ARENA_MAX)


def trim() -> None:
    """Hand the heaps' free pages back to the OS."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def trim_after(tokens: int) -> None:
    """`trim` when work of `tokens` tokens has just been freed."""
    if tokens >= TRIM_AFTER_TOKENS:
        trim()
