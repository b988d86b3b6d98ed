"""`see.durability`: when a Publish is acknowledged relative to Redis's disk.

- `default`: when Redis has applied the batch. With Redis's usual AOF policy (`appendfsync
  everysec`) a host crash can lose up to about one second of acknowledged records; a crash of
  SEE or of redis-server alone loses nothing (the AOF is in the kernel's page cache).
- `fsync`: only once the batch is fsynced to the AOF. Either the server(s) run
  `appendonly yes` with `appendfsync always` (Redis fsyncs before it replies, any version), or,
  on Redis >= 7.2 with the AOF on, SEE follows each batch with `WAITAOF 1 0` on the same
  connection. Anything else (AOF off, `everysec` on Redis < 7.2 such as Debian's 7.0, or a
  server that hides its settings) is refused at start with a message saying what to change.
"""

from __future__ import annotations

import enum
from typing import Any

from redis import exceptions as rexc


class DurabilityError(RuntimeError):
    """The server cannot give the durability SEE was configured for: SEE refuses to start."""


class Mode(enum.Enum):
    REDIS = "redis"
    """Acknowledge once applied (the server's own fsync policy)."""
    ALWAYS = "always"
    """The server fsyncs every write before it replies (appendfsync always)."""
    WAITAOF = "waitaof"
    """Follow each Publish with WAITAOF 1 0 (Redis >= 7.2, AOF on)."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:3] if p.isdigit())


def _single(reply: Any, key: str) -> list[dict[Any, Any]]:
    """INFO / CONFIG GET replies of one server, or of every primary of a cluster client."""
    if isinstance(reply, dict) and reply and all(isinstance(v, dict) for v in reply.values()) \
            and key not in reply and key.encode() not in reply:
        return list(reply.values())
    return [reply]


def _get(d: dict[Any, Any], key: str) -> Any:
    return d.get(key, d.get(key.encode()))


async def check(client: Any, durability: str, redis_url: str) -> Mode:
    """The mode `durability` runs in against this server; DurabilityError when impossible."""
    if durability != "fsync":
        return Mode.REDIS
    where = f"Redis at {redis_url}"
    try:
        infos = _single(await client.info("server"), "redis_version")
        persistence = _single(await client.info("persistence"), "aof_enabled")
    except rexc.RedisError as err:
        raise DurabilityError(f"see.durability=fsync: cannot read INFO from {where}: {err}") \
            from err
    if any(str(_get(p, "aof_enabled")) not in ("1", "True") for p in persistence):
        raise DurabilityError(
            f"see.durability=fsync needs the AOF: {where} runs with appendonly no. Start it "
            "with `appendonly yes` and `appendfsync always` (or, on Redis >= 7.2, any "
            "appendfsync), or set see.durability: default.")
    try:
        fsyncs = [_text(_get(c, "appendfsync") or "")
                  for c in _single(await client.config_get("appendfsync"), "appendfsync")]
    except rexc.RedisError:
        fsyncs = []  # CONFIG disabled (managed Redis): only WAITAOF can tell
    if fsyncs and all(f == "always" for f in fsyncs):
        return Mode.ALWAYS
    versions = [_version(_text(_get(i, "redis_version"))) for i in infos]
    if versions and min(versions) >= (7, 2) and len(infos) == 1:
        return Mode.WAITAOF
    seen = ", ".join(sorted(set(fsyncs))) or "unknown (CONFIG GET refused)"
    version = ".".join(map(str, min(versions))) if versions else "unknown"
    raise DurabilityError(
        f"see.durability=fsync: {where} runs Redis {version} with appendfsync {seen}. "
        "Acknowledging a Publish only once it is on disk needs `appendfsync always` on every "
        "server (CONFIG SET appendfsync always, or in redis.conf), or a single Redis >= 7.2 "
        "(SEE then waits for each batch with WAITAOF). Or set see.durability: default.")
