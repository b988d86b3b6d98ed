"""One way to reach Redis from a URL, for every service: a single server, or a Redis Cluster.

A URL whose scheme is `redis+cluster://` (`rediss+cluster://` with TLS) selects redis-py's
cluster client; its host list seeds the cluster (`redis+cluster://h1:7000,h2:7001`; one node is
enough). Every key of a run carries the run id as a hash tag, so a run's keys, its transactions
and its scripts stay in one slot. Any other URL (`redis://`, `rediss://`, `unix://`) is one
server. Needs the `redis` extra of mutualrl-common.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


def is_cluster(url: str) -> bool:
    return urlsplit(url).scheme in CLUSTER_SCHEMES


def _cluster_parts(url: str) -> tuple[str, list[tuple[str, int]]]:
    """(the URL as redis-py's cluster client takes it, every seed host:port)."""
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    seeds: list[tuple[str, int]] = []
    for h in hosts.split(","):
        host, _, port = h.rpartition(":") if ":" in h else (h, "", "6379")
        seeds.append((host.strip("[]"), int(port or 6379)))
    first = f"{seeds[0][0]}:{seeds[0][1]}"
    netloc = f"{userinfo}@{first}" if userinfo else first
    plain = urlunsplit((CLUSTER_SCHEMES[parts.scheme], netloc, "", parts.query, ""))
    return plain, seeds


def async_client(url: str, *, max_connections: int, pool_timeout: float | None = None,
                 **kwargs: Any) -> Any:
    """A redis.asyncio client: `Redis` over a blocking pool of `max_connections` (a burst waits
    up to `pool_timeout` for a free connection), or `RedisCluster` with `max_connections` per
    node. `kwargs`: connection settings (socket timeouts, retry, decode_responses)."""
    import redis.asyncio as aioredis

    if is_cluster(url):
        from redis.asyncio.cluster import ClusterNode

        plain, seeds = _cluster_parts(url)
        kwargs.pop("retry_on_error", None)  # the cluster client retries on its own terms
        return aioredis.RedisCluster.from_url(
            plain, startup_nodes=[ClusterNode(h, p) for h, p in seeds],
            max_connections=max_connections, **kwargs)
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=pool_timeout, **kwargs)
    return aioredis.Redis.from_pool(pool)  # the client owns the pool: aclose() closes it


def sync_client(url: str, **kwargs: Any) -> Any:
    """A synchronous `redis.Redis` or `redis.RedisCluster` for `url`."""
    import redis

    if is_cluster(url):
        from redis.cluster import ClusterNode

        plain, seeds = _cluster_parts(url)
        return redis.RedisCluster.from_url(
            plain, startup_nodes=[ClusterNode(h, p) for h, p in seeds], **kwargs)
    return redis.Redis.from_url(url, **kwargs)
