"""Bearer-token authentication shared by every gRPC service and REST app."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

# Kubernetes gRPC probes and load balancers cannot send metadata, so health stays open.
DEFAULT_EXEMPT = ("/grpc.health.v1.Health/",)
UNAUTHENTICATED_MESSAGE = "missing or invalid bearer token in 'authorization' metadata"


def token_matches(header_value: str | None, token: str) -> bool:
    """True when `header_value` is exactly 'Bearer <token>' (constant-time comparison)."""
    if not header_value:
        return False
    scheme, _, presented = header_value.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(presented.strip().encode(), token.encode())


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata that authenticates a client call (empty when no token)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def _denying_handler(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that aborts with UNAUTHENTICATED."""

    async def deny_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)

    async def deny_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)
        yield  # pragma: no cover - makes this an async generator

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(deny_unary, **kwargs)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(deny_stream, **kwargs)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(deny_unary, **kwargs)
    return grpc.stream_stream_rpc_method_handler(deny_stream, **kwargs)


class BearerAuthInterceptor(grpc.aio.ServerInterceptor):
    """Rejects every call without `authorization: Bearer <token>` (health checks excepted)."""

    def __init__(self, token: str, exempt_prefixes: tuple[str, ...] = DEFAULT_EXEMPT) -> None:
        self._token = token
        self._exempt = exempt_prefixes

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method or ""
        if handler is None or method.startswith(self._exempt):
            return handler
        metadata = dict(handler_call_details.invocation_metadata or ())
        if token_matches(metadata.get("authorization"), self._token):
            return handler
        return _denying_handler(handler)
