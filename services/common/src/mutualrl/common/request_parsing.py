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

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc


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


def _kwargs(handler: grpc.RpcMethodHandler, method: str) -> dict[str, Any]:
    return {"request_deserializer": safe_deserializer(method, handler.request_deserializer),
            "response_serializer": handler.response_serializer}


def parsing_handler(handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
    """`handler` with a deserializer that never raises and INVALID_ARGUMENT for a bad body."""
    if handler.request_deserializer is None:
        return handler
    kwargs = _kwargs(handler, method)
    if handler.unary_unary:
        inner = handler.unary_unary

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, UnparsableRequest):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(unary, **kwargs)
    if handler.unary_stream:
        inner_stream = handler.unary_stream
        if not inspect.isasyncgenfunction(inner_stream):
            # Writes through context.write (grpc.health.v1 Watch): stays a coroutine.

            async def writer(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if isinstance(request, UnparsableRequest):
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
                return await inner_stream(request, context)

            return grpc.unary_stream_rpc_method_handler(writer, **kwargs)

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, UnparsableRequest):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.message)
            async for item in inner_stream(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(stream, **kwargs)
    return handler  # client-streaming RPCs are not used by MutualRL


class RequestParsingInterceptor(grpc.aio.ServerInterceptor):
    """Applies `parsing_handler` to every method (health and reflection included)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return parsing_handler(handler, handler_call_details.method or "?")
