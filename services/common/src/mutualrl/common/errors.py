"""Errors a servicer raises, and their mapping onto gRPC status codes.

Servicers (and the stores under them) raise these with the offending field named; the
`grpc_errors` decorator turns them into INVALID_ARGUMENT / NOT_FOUND / ... so bad input never
crashes a server or reaches the client as UNKNOWN."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, TypeVar, cast

import grpc

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


class ServiceError(Exception):
    """Base: carries the gRPC code and an HTTP status for the REST twin."""

    code = grpc.StatusCode.INTERNAL
    http_status = 500

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


class InvalidArgument(ServiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT
    http_status = 400


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND
    http_status = 404


class AlreadyExists(ServiceError):
    code = grpc.StatusCode.ALREADY_EXISTS
    http_status = 409


class FailedPrecondition(ServiceError):
    code = grpc.StatusCode.FAILED_PRECONDITION
    http_status = 409


class ResourceExhausted(ServiceError):
    """A backing store is full (Redis OOM): retrying will not help until space is freed."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 507


class Unavailable(ServiceError):
    """A backing store (Redis) does not answer: retryable, clients back off and try again."""

    code = grpc.StatusCode.UNAVAILABLE
    http_status = 503


def grpc_errors(method: F) -> F:
    """Map ServiceError to its status code and anything unexpected to INTERNAL (logged)."""
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                async for item in method(self, request, context):
                    yield item
            except ServiceError as err:
                await context.abort(err.code, str(err))
            except grpc.aio.AbortError:
                raise
            except Exception as err:  # a bug must not kill the server
                log.exception("%s failed", method.__qualname__)
                await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {err!r}")

        return cast(F, stream)  # the same signature as `method`

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except ServiceError as err:
            await context.abort(err.code, str(err))
        except grpc.aio.AbortError:
            raise
        except Exception as err:  # a bug must not kill the server
            log.exception("%s failed", method.__qualname__)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {err!r}")

    return cast(F, unary)  # the same signature as `method`
