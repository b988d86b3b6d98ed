"""SEE configuration: the `see:` section of a run YAML (every field documented)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from mutualrl.common.bounds import DEFAULT_MAX_ROUND_AHEAD, MAX_ROUND
from mutualrl.common.config import Config, ServiceConfig
from mutualrl.common.records import DEFAULT_LIMITS as _D

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


ANSWER_SLACK = 64 * 1024
"""Bytes an answer may need beside its records (ids, counts, framing)."""


def _default_redis_url() -> str:
    return os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL


class SeeLimits(Config):
    """Size limits on what Publish accepts (each violation is INVALID_ARGUMENT naming the field)."""

    max_batch_records: int = Field(default=4096, ge=1, le=65536)
    """Most records one Publish call may carry."""
    max_record_bytes: int = Field(default=_D.max_record_bytes, ge=256)
    """Largest serialized ExperienceRecord in bytes."""
    max_text_chars: int = Field(default=_D.max_text_chars, ge=1)
    """Longest `text` / `prompt_text` in characters."""
    max_tokens: int = Field(default=_D.max_tokens, ge=1)
    """Longest token array (token_ids, offsets, logprobs)."""
    max_meta_entries: int = Field(default=_D.max_meta_entries, ge=0)
    """Most `meta` entries per record."""
    max_meta_chars: int = Field(default=_D.max_meta_chars, ge=1)
    """Longest `meta` key or value in characters."""
    max_response_bytes: int = Field(default=32 * 1024 * 1024, ge=64 * 1024)
    """Bytes one answer carries at most, over gRPC and REST: a page that would be larger ends
    early with a continuation (`next_page_token`, FetchRollouts' `more`, REST's `next_cursor`)
    and holds at least one entry. Reads size what they would return before they load it (the
    index knows each record's length), so this also bounds what one read holds in memory. At
    least `max_record_bytes` plus 64 KiB, at most the gRPC message limit less 64 KiB."""
    max_round_ahead: int = Field(default=DEFAULT_MAX_ROUND_AHEAD, ge=1, le=MAX_ROUND)
    """Rounds past the run's current round (the highest round its records and metric rows hold)
    a request may name: a record's round, GetRoundStats' round, FetchRollouts' current_round,
    GetVerifiedSuccesses' min_round, a metric row's round; beyond it INVALID_ARGUMENT. A run
    holding no round yet takes any first round up to 2^31 - 1 (`mutualrl.common.bounds`)."""
    max_cached_runs: int = Field(default=1024, ge=1, le=1_000_000)
    """Run configs a SEE process keeps in memory (a few seconds each; the least recently read
    go first): bounds its memory whatever run ids clients send."""
    max_successes_per_prompt: int = Field(default=256, ge=1)
    """Distinct (policy, normalised text) successes kept per prompt for GetVerifiedSuccesses;
    further distinct texts are still stored as records but not indexed."""


class RetentionDefaults(Config):
    """Retention applied to runs that leave a Retention field at 0."""

    max_stream_len: int = Field(default=100_000, ge=1, le=1_000_000_000)
    """Approximate cap on entries per record stream (XADD/XTRIM MAXLEN ~)."""
    ttl_seconds: int = Field(default=7 * 24 * 3600, ge=1, le=100 * 366 * 24 * 3600)
    """Seconds a run's keys live after its last write (refreshed on every write)."""
    max_rounds: int = Field(default=1024, ge=1, le=10_000_000)
    """Rounds of REWARD_STATS kept queryable; older rounds are dropped."""


class SeeConfig(ServiceConfig):
    """The Shared Experience Exchange process: gRPC (experience.proto) plus REST inspection."""

    port: int = Field(default=50051, ge=0, le=65535)
    """gRPC port; 0 picks a free one (the bound port is logged)."""
    redis_url: str = Field(default_factory=_default_redis_url)
    """Redis holding every run (redis://host:port/db or rediss://...), or a Redis Cluster
    (redis+cluster://host:port[,host:port...], rediss+cluster:// with TLS); defaults to the
    REDIS_URL environment variable, else redis://127.0.0.1:6379/0."""
    rest_host: str | None = None
    """Interface the REST app binds to; None uses `host`."""
    rest_port: int | None = Field(default=8080, ge=0, le=65535)
    """REST (FastAPI) port; 0 picks a free one; None serves no REST app."""
    max_inflight_request_bytes: int = Field(default=128 * 1024 * 1024, ge=1024)
    """Request bytes SEE's calls hold at once: a call takes its method's largest request
    before its body is read (Publish and ReportMetrics: `max_message_bytes`), then the body's
    length, held until its answer is sent; one that does not fit waits up to
    `request_wait_seconds`, then is RESOURCE_EXHAUSTED (retry later). One call alone always
    runs. A maximal ReportMetrics takes about six times its bytes while it is checked and
    stored, so this bounds SEE's peak (docs/reliability.md)."""
    public_docs: bool = True
    """Serve /docs and /openapi.json without the bearer token (they hold the schema, no data).
    /healthz is always open; every other REST route needs the token when one is configured."""
    public_metrics: bool = False
    """Serve /metrics without the bearer token (for scrapers that cannot send one)."""
    redis_max_connections: int = Field(default=64, ge=4)
    """Connection pool size to Redis for everything but blocking reads."""
    redis_max_blocking_reads: int = Field(default=32, ge=1, le=10_000)
    """Blocking reads (FetchRollouts with block_ms > 0, Subscribe) that wait at once, each on
    its own connection of a separate pool: waiting readers never take Publish's connections.
    One more FetchRollouts that would block is RESOURCE_EXHAUSTED; a Subscribe waits its turn."""
    retention: RetentionDefaults = Field(default_factory=RetentionDefaults)
    """Retention for runs that do not set their own."""
    limits: SeeLimits = Field(default_factory=SeeLimits)
    """Publish size limits."""
    durability: Literal["default", "fsync"] = "default"
    """When a Publish is acknowledged: `default` once Redis has applied it (with Redis's usual
    `appendfsync everysec`, a host crash can lose up to ~1 s of acknowledged records); `fsync`
    only once it is fsynced to the AOF: needs `appendonly yes` with `appendfsync always`, or a
    single Redis >= 7.2 with the AOF on (SEE waits with WAITAOF). SEE refuses to start when the
    server cannot give it (durability.py)."""
    workers: int = Field(default=1, ge=1, le=64)
    """gRPC worker processes sharing the port (SO_REUSEPORT). SEE keeps no state outside Redis,
    so each worker is a full replica; the first also serves REST, and /metrics sums all of them
    (prometheus multiprocess mode). More than 1 lets Publish use several cores. The kernel
    hands each new connection to a worker by a hash of its addresses, not by load, and a client
    keeps its connection, so the work spreads evenly only over many clients: 4 writers over 2
    workers split 2+2 in 3 of 8 starts (`mutualrl bench see --workers N` reports the split)."""
    poll_interval_ms: int = Field(default=20, ge=1, le=1000)
    """Sleep between checks while GetRoundStats waits for missing peers."""
    max_wait_ms: int = Field(default=60_000, ge=0)
    """Longest wait GetRoundStats / FetchRollouts honour whatever the client asks."""
    thl_address: str | None = Field(default_factory=lambda: os.environ.get("MUTUALRL_THL_ADDR")
                                    or None)
    """THL (host:port) the dashboard's record browser asks for receivers' token boundaries and
    THL's chunks (SEE owns no tokenizer); defaults to the MUTUALRL_THL_ADDR environment variable;
    None shows the sender's tokens only. Calls carry SEE's own bearer token."""
    thl_tls_ca: Path | None = None
    """PEM root certificate for a THL that listens with TLS; None connects in plaintext."""

    @model_validator(mode="after")
    def _answers_fit(self) -> SeeConfig:
        limits = self.limits
        if limits.max_response_bytes < limits.max_record_bytes + ANSWER_SLACK:
            raise ValueError("limits.max_response_bytes must be at least limits.max_record_bytes "
                             f"+ {ANSWER_SLACK} (an answer holds at least one record)")
        if limits.max_response_bytes > self.max_message_bytes - ANSWER_SLACK:
            raise ValueError(f"limits.max_response_bytes must be at most max_message_bytes - "
                             f"{ANSWER_SLACK} (an answer must fit one gRPC message)")
        return self
