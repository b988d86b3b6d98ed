"""Client side of every service: channels (plaintext or TLS), auth metadata, and the outage
budget: how long a call keeps retrying UNAVAILABLE, so a restarting service costs a delay, not a
crash.

A call's `timeout` is the deadline of one attempt (the service's time to answer). An UNAVAILABLE
answer (nothing listens, the connection broke, the service is draining) is retried with
exponential backoff for as long as `outage_budget` seconds from the first one; the deadline
never cuts that short, since the time a service is away is not time it spent answering. A
call therefore ends within about `outage_budget + timeout` seconds. The loop is the client's
own (`Outage`, used by `mutualrl.client.base`), not gRPC's `retryPolicy`: gRPC caps a policy at
five attempts inside the one deadline, which is ~1.5 s of backoff, shorter than a service's
restart. Retried writes are idempotent: SEE stores a record id once (a retry answers DUPLICATE),
MWRA folds one step cost per round, THL's registration overwrites the same entry.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import grpc
from pydantic import Field

from mutualrl.common.auth import bearer_metadata
from mutualrl.common.config import Config

DEFAULT_OUTAGE_BUDGET = 60.0
"""Seconds a call keeps retrying UNAVAILABLE by default: a service restart (a few seconds
locally, a rescheduled pod in tens of seconds) with room to spare."""
INTERACTIVE_OUTAGE_BUDGET = 5.0
"""The budget of a command a person waits on (`mutualrl inspect`, `mutualrl thl`): a service
that is not there is said within seconds."""


class ClientOptions(Config):
    """How a client reaches one service."""

    address: str = "127.0.0.1:50051"
    """host:port of the service."""
    token: str | None = None
    """Bearer token sent with every call; defaults to MUTUALRL_AUTH_TOKEN when unset."""
    tls_ca: Path | None = None
    """PEM root certificate; when set the channel uses TLS."""
    timeout: float = Field(default=30.0, gt=0)
    """Deadline of one attempt of a call in seconds (calls that wait server-side add their own
    wait to it); the time an outage lasts does not count against it."""
    outage_budget: float = Field(default=DEFAULT_OUTAGE_BUDGET, ge=0)
    """Seconds a call keeps retrying while the service answers UNAVAILABLE (down, restarting,
    unreachable), counted from its first such answer; then the call raises that UNAVAILABLE.
    0: no retry."""
    backoff_base: float = Field(default=0.1, gt=0)
    """First retry delay in seconds (drawn within +-25%); doubles each attempt. Also the
    channel's first reconnect delay."""
    backoff_max: float = Field(default=2.0, gt=0)
    """Cap on a single retry or reconnect delay in seconds: how late, at most, a call finds a
    service that came back."""

    def metadata(self) -> tuple[tuple[str, str], ...]:
        import os

        return bearer_metadata(self.token or os.environ.get("MUTUALRL_AUTH_TOKEN"))

    def backoff(self, attempt: int) -> float:
        """Delay before retry number `attempt` (0 first) of an UNAVAILABLE call or stream."""
        delay = min(self.backoff_max, self.backoff_base * (2**attempt))
        return delay * random.uniform(0.75, 1.25)

    def channel_options(self, max_bytes: int = 64 * 1024 * 1024) -> list[tuple[str, int | str]]:
        """Message size limits, and reconnect delays on the scale of the retries' backoff
        (gRPC's default reconnect backoff grows to 120 s: a service back after a few seconds
        would go unnoticed by the channel for much longer)."""
        return [("grpc.max_receive_message_length", max_bytes),
                ("grpc.max_send_message_length", max_bytes),
                ("grpc.initial_reconnect_backoff_ms", max(1, int(self.backoff_base * 1000))),
                ("grpc.min_reconnect_backoff_ms", max(1, int(self.backoff_base * 1000))),
                ("grpc.max_reconnect_backoff_ms",
                 max(1, int(max(self.backoff_max, self.backoff_base) * 1000)))]


class Outage:
    """The time one call (or stream) has spent without its service: whether and when to try
    again after an error. A stream calls `reset` whenever a message arrives."""

    def __init__(self, options: ClientOptions, budget: float | None = None) -> None:
        self.options = options
        self.budget = options.outage_budget if budget is None else max(budget, 0.0)
        """Seconds this call retries UNAVAILABLE (the options' budget unless the call has its
        own: a read bounded by a round's deadline)."""
        self.since: float | None = None
        """time.monotonic() of the first UNAVAILABLE of the current outage (None: none)."""
        self.attempt = 0

    def retry_in(self, code: grpc.StatusCode) -> float | None:
        """Seconds to wait before the next attempt, or None when the call should raise: the
        error is not UNAVAILABLE, or the outage has lasted `outage_budget`."""
        if code != grpc.StatusCode.UNAVAILABLE:
            return None
        now = time.monotonic()
        if self.since is None:
            self.since = now
        left = self.since + self.budget - now
        if left <= 0:
            return None
        delay = min(self.options.backoff(self.attempt), left)
        self.attempt += 1
        return delay

    @property
    def lasted(self) -> float:
        """Seconds since the outage's first UNAVAILABLE (0 without one)."""
        return 0.0 if self.since is None else time.monotonic() - self.since

    def reset(self) -> None:
        self.since, self.attempt = None, 0

    def exhausted(self, err: grpc.RpcError) -> grpc.RpcError:
        """`err` (UNAVAILABLE) with the outage's length and budget added to its details, to
        raise when the budget is spent."""
        if self.since is None or err.code() != grpc.StatusCode.UNAVAILABLE:
            return err
        return grpc.aio.AioRpcError(
            err.code(), grpc.aio.Metadata(), grpc.aio.Metadata(),
            f"{err.details()} (still unavailable after {self.lasted:.1f} s of retries; "
            f"the call's outage budget is {self.budget:g} s)")


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
