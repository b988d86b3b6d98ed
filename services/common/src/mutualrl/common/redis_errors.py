"""The one mapping of Redis failures onto service errors (and so onto gRPC / HTTP status).

- refused or reset connections, timeouts, LOADING, READONLY (a failover), CLUSTERDOWN,
  TRYAGAIN, any OSError -> `Unavailable` (UNAVAILABLE): transient, clients back off and retry;
- OOM (maxmemory reached without eviction) -> `ResourceExhausted` (RESOURCE_EXHAUSTED): a retry
  will not help until retention frees memory;
- anything else (a wrong command, a script error) -> unchanged, so INTERNAL and logged: a bug,
  not the caller's fault.

`redis_op` is the async context manager the stores wrap their Redis calls in, with optional
per-service metrics hooks; `redis_errors` is the same as a decorator for servicer methods
(plain coroutines and async generators); `sync_redis_op` serves synchronous stores.
Needs the `redis` extra of mutualrl-common.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Protocol, TypeVar, cast

from redis import exceptions as rexc

from mutualrl.common.errors import ResourceExhausted, ServiceError, Unavailable, grpc_errors

F = TypeVar("F", bound=Callable[..., Any])

TRANSIENT: tuple[type[BaseException], ...] = (
    rexc.ConnectionError, rexc.TimeoutError, rexc.ReadOnlyError, rexc.ClusterDownError,
    rexc.TryAgainError, OSError)
"""Failures that pass: a restart, a failover, a network blip (BusyLoadingError, LOADING, is a
ConnectionError)."""


class RedisMetrics(Protocol):
    """What a service counts about its Redis calls (SEE's `metrics.py` provides one)."""

    def failed(self, op: str, error: BaseException) -> None: ...

    def timed(self, op: str, seconds: float) -> None: ...


def service_error(err: BaseException, what: str) -> ServiceError | None:
    """The ServiceError a Redis failure during `what` becomes; None when it is a bug (re-raise)."""
    if isinstance(err, rexc.OutOfMemoryError):
        return ResourceExhausted("", f"redis is out of memory during {what}: {err}")
    if isinstance(err, TRANSIENT):
        return Unavailable("", f"redis unavailable during {what}: {err}")
    return None


@contextlib.asynccontextmanager
async def redis_op(op: str, metrics: RedisMetrics | None = None) -> AsyncIterator[None]:
    """Run a block of Redis calls named `op`: failures mapped by `service_error`, each failure
    (and the block's time, when `metrics` is given) reported."""
    start = time.perf_counter()
    try:
        yield
    except (rexc.RedisError, OSError) as err:
        if metrics is not None:
            metrics.failed(op, err)
        mapped = service_error(err, op)
        if mapped is None:
            raise
        raise mapped from err
    finally:
        if metrics is not None:
            metrics.timed(op, time.perf_counter() - start)


@contextlib.contextmanager
def sync_redis_op(op: str) -> Iterator[None]:
    """`redis_op` for synchronous redis-py clients (no metrics)."""
    try:
        yield
    except (rexc.RedisError, OSError) as err:
        mapped = service_error(err, op)
        if mapped is None:
            raise
        raise mapped from err


def redis_errors(method: F) -> F:
    """Decorator form of `redis_op` for servicer methods (coroutines and async generators),
    placed below `grpc_errors` so the mapped errors get their status codes."""
    what = method.__name__
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream(*args: Any, **kwargs: Any) -> Any:
            async with redis_op(what):
                async for item in method(*args, **kwargs):
                    yield item

        return cast(F, stream)  # the same signature as `method`

    @functools.wraps(method)
    async def unary(*args: Any, **kwargs: Any) -> Any:
        async with redis_op(what):
            return await method(*args, **kwargs)

    return cast(F, unary)  # the same signature as `method`


def redis_rpc(method: F) -> F:
    """An RPC of a servicer over Redis: `grpc_errors` over `redis_errors`."""
    return grpc_errors(redis_errors(method))
