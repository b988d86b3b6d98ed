"""Errors a servicer raises, and their mapping onto gRPC status codes.

Servicers (and the stores under them) raise these with the offending field named; the
`grpc_errors` decorator turns them into INVALID_ARGUMENT / NOT_FOUND / ... so bad input never
crashes a server or reaches the client as UNKNOWN.

A message never carries more than a bounded prefix of what a caller sent: `quote` is how every
service writes a caller-supplied string into a message (a 10 kB id is quoted as its first 64
characters and its length), and `ServiceError` cuts its field path and message to
`MAX_FIELD_CHARS` / `MAX_MESSAGE_CHARS`, so an answer's status details (a gRPC trailer, which
clients refuse beyond 8 KiB, or a REST body) stay small whatever the request held."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

import grpc

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])

MAX_QUOTED_CHARS = 64
"""Characters of a caller-supplied string a message quotes (`quote`)."""
MAX_FIELD_CHARS = 256
"""Longest field path an error names."""
MAX_MESSAGE_CHARS = 1024
"""Longest message of an error (its field path aside)."""


def quote(value: object, limit: int = MAX_QUOTED_CHARS) -> str:
    """`repr` of a caller-supplied value for a message, bounded: at most `limit` characters of
    it, and when it is longer, its length (`'aaaa'... (10000 characters)`)."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def quote_all(values: Iterable[object], most: int = 4) -> str:
    """`quote` of the first `most` values, comma-separated, then how many more there are."""
    items = list(values)
    shown = ", ".join(quote(v) for v in items[:most])
    return shown if len(items) <= most else f"{shown} and {len(items) - most} more"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... (cut at {limit} characters)"


class ServiceError(Exception):
    """Base: carries the gRPC code and an HTTP status for the REST twin (a subclass names both
    in its class line: `class NotFound(ServiceError, code=..., http_status=404)`)."""

    code = grpc.StatusCode.INTERNAL
    http_status = 500

    def __init_subclass__(cls, code: grpc.StatusCode | None = None, http_status: int = 0,
                          **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code, cls.http_status = code, http_status

    def __init__(self, field: str, message: str) -> None:
        field, message = _cut(field, MAX_FIELD_CHARS), _cut(message, MAX_MESSAGE_CHARS)
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


class InvalidArgument(ServiceError, code=grpc.StatusCode.INVALID_ARGUMENT, http_status=400):
    pass


class NotFound(ServiceError, code=grpc.StatusCode.NOT_FOUND, http_status=404):
    pass


class AlreadyExists(ServiceError, code=grpc.StatusCode.ALREADY_EXISTS, http_status=409):
    pass


class FailedPrecondition(ServiceError, code=grpc.StatusCode.FAILED_PRECONDITION,
                         http_status=409):
    pass


class Unauthenticated(ServiceError, code=grpc.StatusCode.UNAUTHENTICATED, http_status=401):
    """The call carries no valid credential."""


class PermissionDenied(ServiceError, code=grpc.StatusCode.PERMISSION_DENIED, http_status=403):
    """The call's credential may not do what it asks."""


class ResourceExhausted(ServiceError, code=grpc.StatusCode.RESOURCE_EXHAUSTED, http_status=507):
    """A backing store is full (Redis OOM): retrying will not help until space is freed."""


class Unavailable(ServiceError, code=grpc.StatusCode.UNAVAILABLE, http_status=503):
    """A backing store (Redis) does not answer: retryable, clients back off and try again."""


async def _answer(err: Exception, context: grpc.aio.ServicerContext, method: Any) -> None:
    """Abort the call with `err`'s code (INTERNAL, logged, for anything unexpected)."""
    if isinstance(err, grpc.aio.AbortError):
        raise err
    if isinstance(err, ServiceError):
        await context.abort(err.code, str(err))
    log.exception("%s failed", method.__qualname__)
    await context.abort(grpc.StatusCode.INTERNAL,
                        _cut(f"internal error: {err!r}", MAX_MESSAGE_CHARS))


def grpc_errors(method: F) -> F:
    """Map ServiceError to its status code and anything unexpected to INTERNAL (logged)."""
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                async for item in method(self, request, context):
                    yield item
            except Exception as err:  # a bug must not kill the server
                await _answer(err, context, method)

        return cast(F, stream)  # the same signature as `method`

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except Exception as err:  # a bug must not kill the server
            await _answer(err, context, method)

    return cast(F, unary)  # the same signature as `method`


def require_nonnegative(field: str, value: float) -> None:
    """INVALID_ARGUMENT naming `field` when `value` is below zero."""
    if value < 0:
        raise InvalidArgument(field, "must be >= 0")
