"""SEE's Redis clients (redis.asyncio, public API only): one server or a Redis Cluster
(`redis+cluster://...`, `mutualrl.common.redis_connect`)."""

from __future__ import annotations

from typing import Any

from redis import exceptions as rexc
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from mutualrl.common import redis_connect
from mutualrl.see.config import SeeConfig

# Longest a blocking read may wait (FetchRollouts' block_ms, proto: <= 30 s), plus slack for
# Redis to answer: the socket timeout of the blocking-reads client.
_BLOCKING_SOCKET_TIMEOUT_S = 30 + 5
# A plain command that takes this long means Redis is gone or stuck: UNAVAILABLE.
_SOCKET_TIMEOUT_S = 5


def redis_client(cfg: SeeConfig, *, blocking: bool = False) -> Any:
    """A client whose failures become UNAVAILABLE within about a second (a short, bounded
    retry): clients retry with their own backoff instead of the call stalling. `blocking`: the
    client for blocking reads (`blocking.py`), with its own pool and a socket timeout above the
    longest wait."""
    return redis_connect.async_client(
        cfg.redis_url,
        max_connections=(cfg.redis_max_blocking_reads if blocking
                         else cfg.redis_max_connections),
        pool_timeout=10, socket_connect_timeout=5,
        socket_timeout=_BLOCKING_SOCKET_TIMEOUT_S if blocking else _SOCKET_TIMEOUT_S,
        retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), 2),
        retry_on_error=[rexc.ConnectionError, rexc.TimeoutError])
