"""Request bodies that do not parse become INVALID_ARGUMENT, on every RPC of every service.

grpc runs a method's request deserializer before any handler code; when it raises (random
bytes, a `string` field carrying invalid UTF-8) grpc answers UNKNOWN and logs a traceback at
ERROR, before auth has even looked at the call. `RequestParsingInterceptor` swaps every
deserializer for one that never raises: a body that fails to parse becomes an
`UnparsableRequest`, which the wrapped handler answers with INVALID_ARGUMENT naming the message
type. The auth interceptor sits outside this one, so a call without a valid token still gets
UNAUTHENTICATED, whatever its body.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from mutualrl.common.handlers import HandlerInterceptor, guarded


@dataclass(frozen=True)
class UnparsableRequest:
    """Stands in for a request body that its deserializer refused."""

    message_type: str
    """Full name of the request message (the method's path when the parser does not say)."""
    error: str

    @property
    def message(self) -> str:
        return (f"request: body is not a valid {self.message_type} (string fields must be "
                f"valid UTF-8): {self.error}")


def safe_deserializer(method: str, deserializer: Callable[[bytes], Any] | None
                      ) -> Callable[[bytes], Any] | None:
    """`deserializer` that returns an `UnparsableRequest` instead of raising."""
    if deserializer is None:  # raw bytes reach the handler (SEE's Publish parses them itself)
        return None
    # A generated handler's deserializer is the bound `FromString` of the message class.
    descriptor = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    message_type = getattr(descriptor, "full_name", method)

    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as err:  # DecodeError, and whatever a custom parser raises on bad bytes
            return UnparsableRequest(message_type, str(err) or type(err).__name__)

    return parse


async def _reject_unparsable(request: Any, context: grpc.aio.ServicerContext) -> None:
    if isinstance(request, UnparsableRequest):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)


def parsing_handler(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """`handler` with a deserializer that never raises and INVALID_ARGUMENT for a bad body."""
    if handler.request_deserializer is None or not (handler.unary_unary or handler.unary_stream):
        return handler  # raw bytes (the handler parses), or client streams (unused here)
    return guarded(handler, _reject_unparsable,
                   safe_deserializer(method, handler.request_deserializer))


class RequestParsingInterceptor(HandlerInterceptor):
    """Applies `parsing_handler` to every method (health and reflection included)."""

    def wrap(self, handler: grpc.RpcMethodHandler,
             details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        return parsing_handler(handler, details.method or "?")
