"""Handing freed memory back to the OS (glibc's `malloc_trim`) after large work.

A tokenizer's Encoding of a 1 MiB text takes ~140 MB; once freed, glibc keeps those pages in
the heap of the thread that worked on it (resident, though free) until that heap happens to be
reused, so the next large text's Encoding would stand beside them. THL trims after each large
item and after each large call, so its resident size follows what it holds. Not glibc (musl,
macOS): nothing to do.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable

TRIM_AFTER_TOKENS = 64 * 1024
"""An item of at least this many tokens is trimmed after."""


def _load_malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


_MALLOC_TRIM = _load_malloc_trim()

_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 20
"""Allocations of at least this many bytes get their own pages (`settle`)."""


def settle() -> None:
    """Give every allocation of `MMAP_THRESHOLD` bytes or more its own pages, returned to the
    OS when it is freed. glibc's default raises that threshold to the largest block freed so
    far (up to 32 MiB), after which a request's bytes, an answer's and large arrays are carved
    from the heaps of whichever threads touched them and stay resident after: a service that
    receives and answers tens of MB at a time would keep each thread's high-water mark."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    except (OSError, AttributeError):  # not glibc
        return


def trim() -> None:
    """Hand the heaps' free pages back to the OS."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def trim_after(tokens: int) -> None:
    """`trim` when work of `tokens` tokens has just been freed."""
    if tokens >= TRIM_AFTER_TOKENS:
        trim()
