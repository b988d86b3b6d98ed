"""SEE-specific Prometheus metrics (per-method call counts and latency come from start_server)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

RECORDS_IN = Counter(
    "mutualrl_see_records_in", "Records received by Publish, by kind and outcome.",
    ["kind", "status"])
BYTES_IN = Counter(
    "mutualrl_see_bytes_in", "Serialized bytes of newly stored records, by kind.", ["kind"])
RECORDS_OUT = Counter(
    "mutualrl_see_records_out", "Records handed to consumers, by kind and read path.",
    ["kind", "path"])
BYTES_OUT = Counter(
    "mutualrl_see_bytes_out", "Serialized bytes of records handed to consumers, by kind.",
    ["kind"])
STORED_REFUSED = Counter(
    "mutualrl_see_stored_refused", "Stored entries a read left out because they break today's "
    "record rules (stored before a rule existed), by kind.", ["kind"])
PAGES_CUT = Counter(
    "mutualrl_see_pages_cut", "Answers that ended early at the byte budget, by read.", ["read"])
TRIMMED = Counter(
    "mutualrl_see_trimmed", "Entries removed by retention, by stream (round_stats = rounds).",
    ["stream"])
REDIS_ERRORS = Counter(
    "mutualrl_see_redis_errors", "Redis commands that failed, by operation and error type.",
    ["op", "error"])
REDIS_SECONDS = Histogram(
    "mutualrl_see_redis_seconds", "Time spent in Redis per store operation.", ["op"],
    buckets=(0.0002, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
             30))
PUBLISH_BATCH = Histogram(
    "mutualrl_see_publish_batch_records", "Records per Publish call.",
    buckets=(1, 4, 16, 64, 256, 1024, 4096))
ROUND_STATS_WAIT = Histogram(
    "mutualrl_see_round_stats_wait_seconds",
    "How long GetRoundStats waited for peers (ends at completeness or the deadline).",
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))


class _RedisMetrics:
    """The `mutualrl.common.redis_errors.RedisMetrics` hooks SEE's store passes to `redis_op`."""

    def failed(self, op: str, error: BaseException) -> None:
        REDIS_ERRORS.labels(op, type(error).__name__).inc()

    def timed(self, op: str, seconds: float) -> None:
        REDIS_SECONDS.labels(op).observe(seconds)


REDIS = _RedisMetrics()
