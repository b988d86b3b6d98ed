"""A method handler with a check run before its behaviour, for the server interceptors (request
parsing, auth scopes): the check sees the parsed request and may abort the call."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

Check = Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]]
Deserializer = Callable[[bytes], Any] | None


def _call(inner: Any, check: Check, streams_in: bool) -> Any:
    """`inner` (a coroutine function) after `check`; a client stream's check sees no request."""

    async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await check(None if streams_in else request, context)
        return await inner(request, context)

    return call


def _stream(inner: Any, check: Check, streams_in: bool) -> Any:
    """`inner` (an async generator function) after `check`."""

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await check(None if streams_in else request, context)
        async for item in inner(request, context):
            yield item

    return stream


def guarded(handler: grpc.RpcMethodHandler, check: Check,
            request_deserializer: Deserializer = None) -> grpc.RpcMethodHandler:
    """`handler` of the same shape whose behaviour first awaits `check(request, context)`;
    `request_deserializer` replaces the handler's own when given."""
    deserializer = request_deserializer or handler.request_deserializer
    kwargs = {"request_deserializer": deserializer,
              "response_serializer": handler.response_serializer}
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(
            _call(handler.unary_unary, check, False), **kwargs)
    if handler.unary_stream:
        inner = handler.unary_stream
        # A handler that writes through context.write (grpc.health.v1 Watch) stays a coroutine.
        wrap = _stream if inspect.isasyncgenfunction(inner) else _call
        return grpc.unary_stream_rpc_method_handler(wrap(inner, check, False), **kwargs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(
            _call(handler.stream_unary, check, True), **kwargs)
    return grpc.stream_stream_rpc_method_handler(
        _stream(handler.stream_stream, check, True), **kwargs)


class HandlerInterceptor(grpc.aio.ServerInterceptor):
    """An interceptor that replaces the handler of every known method with `wrap`'s."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return self.wrap(handler, handler_call_details)

    def wrap(self, handler: grpc.RpcMethodHandler,
             details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        raise NotImplementedError
