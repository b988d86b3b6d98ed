"""Client side of every service: channels (plaintext or TLS), auth metadata, and gRPC's own
retry policy on UNAVAILABLE, so a restarting service costs a delay, not a crash.

Retries live in the channel's service config (`retryPolicy`), not in a loop around the call:
the call's deadline covers every attempt and every backoff, so a caller that gives a call
2 s gets its answer or its error within 2 s, however many attempts that took.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import grpc
from pydantic import Field

from mutualrl.common.auth import bearer_metadata
from mutualrl.common.config import Config

RETRYABLE = ("UNAVAILABLE",)
MAX_ATTEMPTS = 5
"""gRPC's cap on attempts per call (a larger maxAttempts is silently lowered to it)."""


class ClientOptions(Config):
    """How a client reaches one service."""

    address: str = "127.0.0.1:50051"
    """host:port of the service."""
    token: str | None = None
    """Bearer token sent with every call; defaults to MUTUALRL_AUTH_TOKEN when unset."""
    tls_ca: Path | None = None
    """PEM root certificate; when set the channel uses TLS."""
    timeout: float = Field(default=30.0, gt=0)
    """Deadline of one call in seconds, all its attempts and backoffs included (calls that wait
    server-side add their own wait to it)."""
    retries: int = Field(default=MAX_ATTEMPTS - 1, ge=0, le=MAX_ATTEMPTS - 1)
    """Extra attempts after an UNAVAILABLE answer, within the call's deadline (gRPC's retry
    policy; at most 4, gRPC's limit)."""
    backoff_base: float = Field(default=0.1, gt=0)
    """Upper bound of the first retry delay in seconds; doubles each attempt (gRPC draws each
    delay uniformly below its bound). Also the channel's first reconnect delay."""
    backoff_max: float = Field(default=5.0, gt=0)
    """Cap on a single retry or reconnect delay in seconds."""

    def metadata(self) -> tuple[tuple[str, str], ...]:
        import os

        return bearer_metadata(self.token or os.environ.get("MUTUALRL_AUTH_TOKEN"))

    def backoff(self, attempt: int) -> float:
        """Delay before re-opening a stream after its `attempt`-th UNAVAILABLE (streams that
        already delivered messages are outside gRPC's retry policy)."""
        delay = min(self.backoff_max, self.backoff_base * (2**attempt))
        return delay * random.uniform(0.75, 1.25)

    def service_config(self) -> str:
        """The channel's service config: gRPC retries UNAVAILABLE `retries` times, on every
        method, under the call's one deadline."""
        if self.retries == 0:
            return json.dumps({"methodConfig": [{"name": [{}]}]})
        policy = {
            "maxAttempts": self.retries + 1,
            "initialBackoff": f"{self.backoff_base:.3f}s",
            "maxBackoff": f"{max(self.backoff_max, self.backoff_base):.3f}s",
            "backoffMultiplier": 2,
            "retryableStatusCodes": list(RETRYABLE),
        }
        return json.dumps({"methodConfig": [{"name": [{}], "retryPolicy": policy}]})

    def channel_options(self, max_bytes: int = 64 * 1024 * 1024) -> list[tuple[str, int | str]]:
        """Message size limits, the retry policy, and reconnect delays on the same scale as the
        retry backoff (gRPC's default first reconnect waits 1 s: most retries would find the
        channel still waiting)."""
        return [("grpc.max_receive_message_length", max_bytes),
                ("grpc.max_send_message_length", max_bytes),
                ("grpc.enable_retries", 1),
                ("grpc.service_config", self.service_config()),
                # gRPC keeps a request for its retries only up to these sizes (defaults 256 KiB
                # per call, 256 MiB per channel): a larger Publish would not be retried at all.
                ("grpc.per_rpc_retry_buffer_size", max_bytes),
                ("grpc.retry_buffer_size", 4 * max_bytes),
                ("grpc.initial_reconnect_backoff_ms", max(1, int(self.backoff_base * 1000))),
                ("grpc.min_reconnect_backoff_ms", max(1, int(self.backoff_base * 1000))),
                ("grpc.max_reconnect_backoff_ms", max(1, int(self.backoff_max * 1000)))]


def sync_channel(opts: ClientOptions) -> grpc.Channel:
    if opts.tls_ca is not None:
        creds = grpc.ssl_channel_credentials(opts.tls_ca.read_bytes())
        return grpc.secure_channel(opts.address, creds, options=opts.channel_options())
    return grpc.insecure_channel(opts.address, options=opts.channel_options())


def aio_channel(opts: ClientOptions) -> grpc.aio.Channel:
    if opts.tls_ca is not None:
        creds = grpc.ssl_channel_credentials(opts.tls_ca.read_bytes())
        return grpc.aio.secure_channel(opts.address, creds, options=opts.channel_options())
    return grpc.aio.insecure_channel(opts.address, options=opts.channel_options())
