"""Client side of every service: channels (plaintext or TLS), auth metadata, and retries with
exponential backoff on UNAVAILABLE so a restarting service costs a delay, not a crash."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import grpc
from pydantic import Field

from mutualrl.common.auth import bearer_metadata
from mutualrl.common.config import Config

T = TypeVar("T")
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})


class ClientOptions(Config):
    """How a client reaches one service."""

    address: str = "127.0.0.1:50051"
    """host:port of the service."""
    token: str | None = None
    """Bearer token sent with every call; defaults to MUTUALRL_AUTH_TOKEN when unset."""
    tls_ca: Path | None = None
    """PEM root certificate; when set the channel uses TLS."""
    timeout: float = Field(default=30.0, gt=0)
    """Per-call deadline in seconds (calls that wait server-side add their own wait to it)."""
    retries: int = Field(default=5, ge=0)
    """Extra attempts after an UNAVAILABLE answer."""
    backoff_base: float = Field(default=0.1, gt=0)
    """First retry delay in seconds; doubles each attempt, with +-25% jitter."""
    backoff_max: float = Field(default=5.0, gt=0)
    """Cap on a single retry delay in seconds."""

    def metadata(self) -> tuple[tuple[str, str], ...]:
        import os

        return bearer_metadata(self.token or os.environ.get("MUTUALRL_AUTH_TOKEN"))

    def backoff(self, attempt: int) -> float:
        delay = min(self.backoff_max, self.backoff_base * (2**attempt))
        return delay * random.uniform(0.75, 1.25)


def _channel_options(max_bytes: int = 64 * 1024 * 1024) -> list[tuple[str, int]]:
    return [("grpc.max_receive_message_length", max_bytes),
            ("grpc.max_send_message_length", max_bytes)]


def sync_channel(opts: ClientOptions) -> grpc.Channel:
    if opts.tls_ca is not None:
        creds = grpc.ssl_channel_credentials(opts.tls_ca.read_bytes())
        return grpc.secure_channel(opts.address, creds, options=_channel_options())
    return grpc.insecure_channel(opts.address, options=_channel_options())


def aio_channel(opts: ClientOptions) -> grpc.aio.Channel:
    if opts.tls_ca is not None:
        creds = grpc.ssl_channel_credentials(opts.tls_ca.read_bytes())
        return grpc.aio.secure_channel(opts.address, creds, options=_channel_options())
    return grpc.aio.insecure_channel(opts.address, options=_channel_options())


def call_with_retry(opts: ClientOptions, fn: Callable[[], T]) -> T:
    """Run `fn` (one RPC), retrying UNAVAILABLE with exponential backoff."""
    for attempt in range(opts.retries + 1):
        try:
            return fn()
        except grpc.RpcError as err:
            if err.code() not in RETRYABLE or attempt == opts.retries:
                raise
            time.sleep(opts.backoff(attempt))
    raise AssertionError("unreachable")


async def acall_with_retry(opts: ClientOptions, fn: Callable[[], Awaitable[T]]) -> T:
    """Async twin of `call_with_retry`."""
    for attempt in range(opts.retries + 1):
        try:
            return await fn()
        except grpc.aio.AioRpcError as err:
            if err.code() not in RETRYABLE or attempt == opts.retries:
                raise
            await asyncio.sleep(opts.backoff(attempt))
    raise AssertionError("unreachable")
