"""SEE's Redis client (redis.asyncio, public API only)."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis import exceptions as rexc
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from mutualrl.see.config import SeeConfig


def redis_client(cfg: SeeConfig) -> Any:
    """A client whose failures become UNAVAILABLE within about a second (a short, bounded
    retry): clients retry with their own backoff instead of the call stalling."""
    pool = aioredis.BlockingConnectionPool.from_url(
        cfg.redis_url, max_connections=cfg.redis_max_connections, timeout=10,
        socket_connect_timeout=5,
        retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), 2),
        retry_on_error=[rexc.ConnectionError, rexc.TimeoutError])
    return aioredis.Redis(connection_pool=pool)
