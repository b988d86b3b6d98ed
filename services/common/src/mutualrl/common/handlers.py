"""A method handler with a check run before its behaviour, for the server interceptors (request
parsing, auth scopes): the check sees the parsed request and may abort the call."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

Check = Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]]
Deserializer = Callable[[bytes], Any] | None


def guarded(handler: grpc.RpcMethodHandler, check: Check,
            request_deserializer: Deserializer = None) -> grpc.RpcMethodHandler:
    """`handler` of the same shape whose behaviour first awaits `check(request, context)`;
    `request_deserializer` replaces the handler's own when given."""
    deserializer = request_deserializer or handler.request_deserializer
    kwargs = {"request_deserializer": deserializer,
              "response_serializer": handler.response_serializer}
    if handler.unary_unary:
        inner = handler.unary_unary

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await check(request, context)
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(unary, **kwargs)
    if handler.unary_stream:
        inner_stream = handler.unary_stream
        if not inspect.isasyncgenfunction(inner_stream):
            # Writes through context.write (grpc.health.v1 Watch): stays a coroutine.

            async def writer(request: Any, context: grpc.aio.ServicerContext) -> Any:
                await check(request, context)
                return await inner_stream(request, context)

            return grpc.unary_stream_rpc_method_handler(writer, **kwargs)

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await check(request, context)
            async for item in inner_stream(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(stream, **kwargs)
    if handler.stream_unary:
        inner_su = handler.stream_unary

        async def stream_unary(requests: Any, context: grpc.aio.ServicerContext) -> Any:
            await check(None, context)
            return await inner_su(requests, context)

        return grpc.stream_unary_rpc_method_handler(stream_unary, **kwargs)
    inner_ss = handler.stream_stream

    async def stream_stream(requests: Any, context: grpc.aio.ServicerContext) -> Any:
        await check(None, context)
        async for item in inner_ss(requests, context):
            yield item

    return grpc.stream_stream_rpc_method_handler(stream_stream, **kwargs)
