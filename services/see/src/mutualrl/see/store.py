"""The Redis store behind SEE (redis.asyncio): runs, publish, reads per probe, inspection.

The servicer and the REST app are thin shells over this class. Key layout: `keys.py`;
the atomic publish: `lua.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncGenerator, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis.asyncio as aioredis
from redis import exceptions as rexc
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from mutualrl.common import ids
from mutualrl.common.errors import AlreadyExists, InvalidArgument, NotFound
from mutualrl.common.redis_errors import redis_op as _redis_op
from mutualrl.see import metrics as m
from mutualrl.see import transfers, wire
from mutualrl.see.config import SeeConfig
from mutualrl.see.hotpath import MalformedRequest, TooManyRecords, accept_records, scan_request
from mutualrl.see.keys import KINDS, RunKeys, kind_name, registry_key
from mutualrl.see.lua import PUBLISH_LUA
from mutualrl.see.validate import normalise_text, text_digest, validate_run_config
from mutualrl.see.wire import (
    publish_response,
    stamp_suffix,
    string_field,
)
from mutualrl.v1 import experience_pb2 as pb

log = logging.getLogger(__name__)

try:  # the sentinel redis-py's hiredis reader returns while a reply is incomplete
    from redis._parsers.hiredis import NOT_ENOUGH_DATA as _NOT_ENOUGH_DATA
except ImportError:  # pragma: no cover - other redis-py layouts: generic path below
    _NOT_ENOUGH_DATA = object()
_MULTI = b"*1\r\n$5\r\nMULTI\r\n"
# SET <key> <record bytes + stamp> NX EX <ttl>, formatted in one step.
_SET_NX_EX = (b"*6\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s%s\r\n$2\r\nNX\r\n$2\r\nEX\r\n"
              b"$%d\r\n%s\r\n")
# The five per-record arguments of the index script (lua.py): rid, kind, policy, header, aux.
_ARGS5 = b"$%d\r\n%s\r\n$1\r\n%d\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n"
_EXEC = b"*1\r\n$4\r\nEXEC\r\n"
SEP = "\x1f"  # joins a stream entry's header fields (ids never contain control characters)
_SEP_BYTES = SEP.encode()
STREAM_ID_RE = re.compile(r"^\d{1,20}-\d{1,20}$")
_RUN_CACHE_SECONDS = 5.0
_MAX_PROMPTS = 4096
_MAX_FETCH = 4096
_MAX_BLOCK_MS = 30_000


def check_stream_id(value: str, field: str) -> str:
    if not STREAM_ID_RE.match(value):
        raise InvalidArgument(field, f"not a stream id of the form <ms>-<seq>: {value[:64]!r}")
    return value


def redis_op(op: str) -> contextlib.AbstractAsyncContextManager[None]:
    """A block of Redis calls: failures mapped by `mutualrl.common.redis_errors`, time and
    failures counted in SEE's metrics."""
    return _redis_op(op, m.REDIS)


# redis-py annotates every reply for every protocol and decoding at once; this client speaks
# RESP2 without decoding, so these are the shapes that actually come back.
Entry = tuple[bytes, dict[bytes, bytes]]
"""One stream entry: (id, fields)."""
StreamReply = list[tuple[bytes, list[Entry]]]
"""XREAD / XREADGROUP: (stream, entries) per stream that had entries."""


@dataclass
class Retention:
    """A run's effective retention (its own values, else the server defaults)."""

    max_stream_len: int
    ttl_seconds: int
    max_rounds: int


@dataclass
class RecordPage:
    """One page of the REST record listing."""

    records: list[tuple[str, pb.ExperienceRecord]]
    next_cursor: str | None
    scanned: int


async def _read_replies(conn: Any, n: int) -> list[Any]:
    """Read `n` replies; error replies come back as exception objects, not raised.

    With hiredis, the C reader parses straight from its buffer (one coroutine step per socket
    read, not per reply: a batch of 256 records has 259 replies)."""
    parser = getattr(conn, "_parser", None)
    reader = getattr(parser, "_reader", None)
    if (parser is not None and reader is not None and hasattr(reader, "gets")
            and hasattr(parser, "read_from_socket")):
        out: list[Any] = []
        while len(out) < n:
            reply = reader.gets()
            if reply is _NOT_ENOUGH_DATA or reply is False:
                await parser.read_from_socket()
                continue
            if isinstance(reply, rexc.ConnectionError):
                raise reply
            out.append(reply)
        return out
    answers: list[Any] = []
    for _ in range(n):
        try:
            answers.append(await conn.read_response())
        except rexc.ResponseError as err:
            answers.append(err)
    return answers


def pack_command(args: Sequence[bytes | str | int]) -> bytes:
    """One command in the Redis protocol (RESP2 array of bulk strings)."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        elif isinstance(a, int):
            a = b"%d" % a
        parts += (b"$%d\r\n" % len(a), a, b"\r\n")
    return b"".join(parts)


@dataclass
class Header:
    """The plain fields of a stream entry (filters read these without parsing the record)."""

    record_id: str
    policy_id: str
    prompt_id: str
    round: int
    verified: bool
    policy_version: int

    @classmethod
    def of(cls, fields: dict[bytes, bytes]) -> Header:
        rid, pol, prompt, rnd, ver, pv = fields[b"h"].decode().split(SEP)
        return cls(rid, pol, prompt, int(rnd), ver == "1", int(pv))


def _sid_key(sid: str) -> tuple[int, int]:
    a, _, b = sid.partition("-")
    return int(a), int(b or 0)


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _i(value: bytes | str | None, default: int = 0) -> int:
    return int(value) if value is not None else default


class SeeStore:
    """All SEE state lives in Redis; this object only caches immutable run configs."""

    def __init__(self, cfg: SeeConfig, client: aioredis.Redis | None = None) -> None:
        self.cfg = cfg
        if client is None:
            # A short, bounded retry: a Redis outage must become UNAVAILABLE (which clients
            # retry with their own backoff) within about a second, not stall the call.
            pool = aioredis.BlockingConnectionPool.from_url(
                cfg.redis_url, max_connections=cfg.redis_max_connections, timeout=10,
                socket_connect_timeout=5,
                retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), 2),
                retry_on_error=[rexc.ConnectionError, rexc.TimeoutError])
            client = aioredis.Redis(connection_pool=pool)
        self.r = client
        self._runs: dict[str, tuple[float, pb.Run]] = {}
        self.stopping = asyncio.Event()

    async def begin_stop(self) -> None:
        """End Subscribe streams and round-stats waits (the server is draining)."""
        self.stopping.set()

    async def close(self) -> None:
        self.stopping.set()
        await self.r.aclose()

    async def ping(self) -> bool:
        try:
            return bool(await self.r.ping())
        except (rexc.RedisError, OSError):
            return False

    def keys(self, run_id: str) -> RunKeys:
        return RunKeys(self.cfg.key_prefix, run_id)

    async def _get(self, key: str) -> bytes | None:
        return cast("bytes | None", await self.r.get(key))

    async def _mget(self, keys: list[str]) -> list[bytes | None]:
        return cast("list[bytes | None]", await self.r.mget(keys)) if keys else []

    async def _xread(self, positions: dict[str, str], count: int,
                     block: int | None = None) -> StreamReply:
        # (redis-py wants a dict of its own key/id unions: invariance refuses dict[str, str])
        reply = await self.r.xread(cast("dict[Any, Any]", positions), count=count, block=block)
        return cast(StreamReply, reply or [])

    async def _xreadgroup(self, group: str, consumer: str, stream: str, start: str, count: int,
                          block: int | None = None) -> list[Entry]:
        reply = await self.r.xreadgroup(group, consumer, {stream: start}, count=count,
                                        block=block)
        return cast(StreamReply, reply)[0][1] if reply else []

    async def _pending_counts(self, stream: str, group: str, consumer: str, lo: str, hi: str,
                              count: int) -> dict[str, int]:
        """Delivery count per pending entry id of `consumer` in [lo, hi]."""
        info = cast("list[dict[str, Any]]", await self.r.xpending_range(
            stream, group, min=lo, max=hi, count=count, consumername=consumer))
        return {_s(p["message_id"]): int(p["times_delivered"]) for p in info}

    # ----------------------------------------------------------------------------------- runs

    def retention(self, run: pb.Run) -> Retention:
        ret, dflt = run.config.retention, self.cfg.retention
        return Retention(max_stream_len=ret.max_stream_len or dflt.max_stream_len,
                         ttl_seconds=ret.ttl_seconds or dflt.ttl_seconds,
                         max_rounds=ret.max_rounds or dflt.max_rounds)

    async def create_run(self, config: pb.RunConfig, exist_ok: bool = False) -> pb.Run:
        validate_run_config(config, self.cfg.limits)
        run = pb.Run(created_unix_ms=int(time.time() * 1000))
        run.config.CopyFrom(config)
        rk = self.keys(config.run_id)
        ttl = self.retention(run).ttl_seconds
        async with redis_op("create_run"):
            created = await self.r.set(rk.config, run.SerializeToString(), nx=True, ex=ttl)
            if not created:
                existing = await self.get_run(config.run_id, use_cache=False)
                if exist_ok and existing.config == config:
                    return existing
                raise AlreadyExists("config.run_id", f"run {config.run_id!r} exists"
                                    + ("" if not exist_ok else " with a different config"))
            async with self.r.pipeline(transaction=False) as pipe:
                # One consumer group per policy from the stream's start: records published
                # before a trainer's first fetch are not missed.
                for policy in config.policies:
                    pipe.xgroup_create(rk.stream(pb.ROLLOUT), policy, id="0", mkstream=True)
                pipe.expire(rk.stream(pb.ROLLOUT), ttl)
                await pipe.execute(raise_on_error=False)
            # The registry is global (another slot in a cluster): written after the run exists.
            await self.r.sadd(registry_key(self.cfg.key_prefix), config.run_id)
        self._runs[config.run_id] = (time.monotonic(), run)
        return run

    async def get_run(self, run_id: str, *, use_cache: bool = True,
                      field: str = "run_id") -> pb.Run:
        ids.check_run_id(run_id, field)
        if use_cache:
            hit = self._runs.get(run_id)
            if hit is not None and time.monotonic() - hit[0] < _RUN_CACHE_SECONDS:
                return hit[1]
        async with redis_op("get_run"):
            raw = await self._get(self.keys(run_id).config)
        if raw is None:
            self._runs.pop(run_id, None)
            raise NotFound(field, f"run {run_id!r} not found")
        run = pb.Run.FromString(raw)
        self._runs[run_id] = (time.monotonic(), run)
        return run

    async def list_runs(self) -> list[pb.Run]:
        reg = registry_key(self.cfg.key_prefix)
        async with redis_op("list_runs"):
            run_ids = sorted(_s(x) for x in await self.r.smembers(reg))
            if not run_ids:
                return []
            async with self.r.pipeline(transaction=False) as pipe:
                for rid in run_ids:
                    pipe.get(self.keys(rid).config)
                raws = await pipe.execute()
            gone = [rid for rid, raw in zip(run_ids, raws, strict=True) if raw is None]
            if gone:  # expired runs leave the registry lazily
                await self.r.srem(reg, *gone)
        return [pb.Run.FromString(raw) for raw in raws if raw is not None]

    async def delete_run(self, run_id: str) -> int:
        """Delete every key of the run and its registry entry; returns the keys deleted.
        NotFound when nothing of the run exists."""
        rk = self.keys(ids.check_run_id(run_id))
        deleted = 0
        async with redis_op("delete_run"):
            batch: list[bytes | str] = []
            async for key in self.r.scan_iter(match=rk.pattern, count=1000):
                batch.append(key)
                if len(batch) >= 512:
                    deleted += int(await self.r.unlink(*batch))
                    batch.clear()
            if batch:
                deleted += int(await self.r.unlink(*batch))
            registered = int(await self.r.srem(registry_key(self.cfg.key_prefix), run_id))
        self._runs.pop(run_id, None)
        if not deleted and not registered:
            raise NotFound("run_id", f"run {run_id!r} not found")
        return deleted

    async def _check_policy(self, run: pb.Run, policy_id: str, field: str = "policy_id") -> None:
        if policy_id not in run.config.policies:
            raise InvalidArgument(field, f"{policy_id!r} is not a policy of run "
                                         f"{run.config.run_id!r}")

    # -------------------------------------------------------------------------------- publish

    async def publish(self, run_id: str, records: Sequence[pb.ExperienceRecord]
                      ) -> pb.PublishResponse:
        """Store parsed records (in-process callers); the RPC path is `publish_request`."""
        body = pb.PublishRequest(run_id=run_id, records=records).SerializeToString()
        return pb.PublishResponse.FromString(await self.publish_request(body))

    async def publish_request(self, body: bytes) -> bytes:
        """The Publish RPC on raw bytes: PublishRequest in, serialized PublishResponse out.

        Validates the whole batch (compiled fast path, reference validator for the rest), then
        stores it with one MULTI/EXEC (atomic, idempotent by record id). Records are stored as
        the client serialized them (no parse/re-serialize round trip)."""
        limits = self.cfg.limits
        try:
            scan = scan_request(body, limits)
            run_id = scan.run_id.decode()
        except (MalformedRequest, UnicodeDecodeError) as err:
            raise InvalidArgument("records", f"malformed PublishRequest: {err}") from None
        except TooManyRecords as err:
            raise InvalidArgument("records", str(err)) from None
        run = await self.get_run(run_id)
        if not scan.rows:
            return publish_response([], "")
        recs = accept_records(body, scan, run.config, limits)
        ret = self.retention(run)
        rk = self.keys(run_id)
        keys = rk.fixed()
        aux_keys: dict[str, int] = {}
        # Trim once a stream is this far past its cap (amortises the trim like MAXLEN ~).
        slack = max(1, min(100, ret.max_stream_len // 10))
        fixed: list[bytes | str | int] = [
            ret.max_stream_len, ret.ttl_seconds, ret.max_rounds,
            limits.max_successes_per_prompt, len(recs), rk.round_stats_prefix, rk.rec_prefix,
            slack]
        sets: list[bytes] = []
        per_record: list[bytes] = []
        ttl = b"%d" % ret.ttl_seconds
        rec_prefix = rk.rec_prefix.encode()
        suffix = stamp_suffix(string_field(wire.F_RUN_ID, run_id), int(time.time() * 1000))
        view = memoryview(body)
        for r in recs:
            header = _SEP_BYTES.join((r.record_id, r.policy_id, r.prompt_id, b"%d" % r.round,
                                   b"1" if r.verified else b"0", b"%d" % r.policy_version))
            aux = b""
            if r.parsed is not None and r.kind != pb.ROLLOUT:
                rec = r.parsed
                key = (rk.round_stats(rec.round) if r.kind == pb.REWARD_STATS
                       else rk.successes(rec.prompt_id))
                idx = aux_keys.get(key)
                if idx is None:
                    keys.append(key)
                    idx = aux_keys[key] = len(keys)
                if r.kind == pb.REWARD_STATS:
                    st = rec.stats
                    aux = SEP.join((str(idx), f"{rec.prompt_id}|{rec.policy_id}",
                                    f"{st.count},{st.sum!r},{st.sum_sq!r},{st.max!r}",
                                    str(rec.round))).encode()
                else:
                    aux = SEP.join((str(idx),
                                    f"{rec.policy_id}|{text_digest(rec.text)}")).encode()
            per_record.append(_ARGS5 % (len(r.record_id), r.record_id, r.kind,
                                        len(r.policy_id), r.policy_id, len(header), header,
                                        len(aux), aux))
            rec_key = rec_prefix + r.record_id
            size = r.end - r.start + len(suffix)
            sets.append(_SET_NX_EX % (len(rec_key), rec_key, size, view[r.start:r.end], suffix,
                                      len(ttl), ttl))
        async with redis_op("publish"):
            reply = await self._run_publish(sets, keys, fixed, per_record)
        flags = _s(reply[0])
        tally: dict[tuple[int, bool], list[int]] = {}
        for r, flag in zip(recs, flags, strict=True):
            t = tally.setdefault((r.kind, flag == "1"), [0, 0])
            t[0] += 1
            t[1] += r.end - r.start + len(suffix)
        for (kind, stored), (count, nbytes) in tally.items():
            name = kind_name(kind)
            m.RECORDS_IN.labels(name, "stored" if stored else "duplicate").inc(count)
            if stored:
                m.BYTES_IN.labels(name).inc(nbytes)
        for kind, tr in zip(KINDS, reply[1:4], strict=True):
            if int(tr):
                m.TRIMMED.labels(kind_name(kind)).inc(int(tr))
        if int(reply[4]):
            m.TRIMMED.labels("round_stats").inc(int(reply[4]))
        m.PUBLISH_BATCH.observe(len(recs))
        return publish_response([r.record_id for r in recs], flags)

    async def _run_publish(self, sets: list[bytes], keys: list[str],
                           fixed: list[bytes | str | int], per_record: list[bytes]) -> Any:
        """One MULTI/EXEC: the payload SETs, then EVAL of the index script; returns the
        script's reply. Packed by hand (redis-py's generic packer costs more per argument than
        everything else SEE does with a record). EVAL rather than EVALSHA: inside MULTI a
        NOSCRIPT error (script cache flushed by a Redis restart) would come back only after
        the SETs were applied; Redis still compiles the script once and caches it by digest."""
        head = pack_command(("EVAL", PUBLISH_LUA, len(keys), *keys, *fixed))
        n_args = 3 + len(keys) + len(fixed) + 5 * len(per_record)
        # The EVAL's argument count covers the per-record arguments packed ahead of time.
        head = b"*%d" % n_args + head[head.index(b"\r\n"):]
        packed = b"".join((_MULTI, *sets, head, *per_record, _EXEC))
        pool = self.r.connection_pool
        conn = await pool.get_connection()
        try:
            await conn.send_packed_command(packed, check_health=False)
            # +OK for MULTI, +QUEUED per command (errors here abort the EXEC), then EXEC.
            answers = await _read_replies(conn, len(sets) + 3)
            queued_error = next((a for a in answers[:-1] if isinstance(a, Exception)), None)
            replies = answers[-1]
            if isinstance(replies, Exception):
                raise (queued_error or replies)  # EXECABORT: nothing was applied
        except rexc.ResponseError:
            raise
        except BaseException:
            # Cancelled or broken mid-transaction: the connection's state is unknown.
            await conn.disconnect()
            raise
        finally:
            await pool.release(conn)
        reply = replies[-1]
        if isinstance(reply, Exception):
            raise reply
        return reply

    # ------------------------------------------------------------------------- peer rollouts

    async def _ensure_group(self, stream: str, group: str) -> None:
        with contextlib.suppress(rexc.ResponseError):  # BUSYGROUP: someone else made it
            await self.r.xgroup_create(stream, group, id="0", mkstream=True)

    async def fetch_rollouts(self, req: pb.FetchRolloutsRequest, deadline: float | None = None
                             ) -> pb.FetchRolloutsResponse:
        """Pending (unacknowledged) entries of this consumer first, then claimed idle ones of
        dead consumers, then new ones; own and stale entries are acknowledged and skipped."""
        run = await self.get_run(req.run_id)
        await self._check_policy(run, req.policy_id)
        ids.check_name(req.consumer, "consumer")  # e.g. the trainer's pod name
        if not 1 <= req.max_records <= _MAX_FETCH:
            raise InvalidArgument("max_records", f"must lie in [1, {_MAX_FETCH}]")
        if not 0 <= req.block_ms <= _MAX_BLOCK_MS:
            raise InvalidArgument("block_ms", f"must lie in [0, {_MAX_BLOCK_MS}]")
        if req.max_round_lag < 0:
            raise InvalidArgument("max_round_lag", "must be >= 0")
        if req.claim_idle_ms < 0:
            raise InvalidArgument("claim_idle_ms", "must be >= 0")
        stream = self.keys(req.run_id).stream(pb.ROLLOUT)
        group, consumer, me = req.policy_id, req.consumer, req.policy_id
        min_round = req.current_round - req.max_round_lag if req.current_round >= 0 else None
        out = pb.FetchRolloutsResponse()
        to_ack: list[str] = []
        taken: dict[tuple[str, int], int] = {}
        chosen: list[tuple[str, str, int, bool, str]] = []

        def keep(entry_id: str, fields: dict[bytes, bytes] | None, count: int,
                 fresh: bool) -> None:
            if fields is None:  # trimmed by retention while pending: nothing left to give
                to_ack.append(entry_id)
                return
            h = Header.of(fields)
            source = h.policy_id
            if source == me:
                to_ack.append(entry_id)
                return
            if (min_round is not None and h.round < min_round) or \
                    h.policy_version < req.min_policy_version:
                to_ack.append(entry_id)
                out.skipped_stale += 1
                return
            chosen.append((entry_id, h.record_id, count, fresh, source))

        async with redis_op("fetch_rollouts"):
            # 1. Our own pending list: what we were given before a restart and never acked.
            try:
                pending = await self._xreadgroup(group, consumer, stream, "0", req.max_records)
            except rexc.ResponseError as err:
                if "NOGROUP" not in str(err):
                    raise
                await self._ensure_group(stream, group)
                pending = []
            if pending:
                eids = [_s(e[0]) for e in pending]
                counts = await self._pending_counts(stream, group, consumer, eids[0], eids[-1],
                                                    len(eids))
                for eid, (_, fields) in zip(eids, pending, strict=True):
                    keep(eid, fields or None, counts.get(eid, 1), False)
            # 2. Entries of consumers that went away (same policy, idle past claim_idle_ms).
            room = req.max_records - len(chosen)
            if room > 0 and req.claim_idle_ms > 0:
                claimed = await self.r.xautoclaim(stream, group, consumer, req.claim_idle_ms,
                                                  start_id="0-0", count=room)
                # XAUTOCLAIM: [next start id, entries, deleted ids]
                entries = cast("list[Entry]", claimed[1]) if claimed else []
                if entries:
                    eids = [_s(e[0]) for e in entries]
                    counts = await self._pending_counts(stream, group, consumer, min(eids),
                                                        max(eids), len(eids) * 4)
                    for eid, (_, fields) in zip(eids, entries, strict=True):
                        keep(eid, fields or None, counts.get(eid, 2), False)
            # 3. New entries; skipped ones do not count, so read on while they fill the page.
            block_ms = req.block_ms
            for _ in range(16):
                room = req.max_records - len(chosen)
                if room <= 0:
                    break
                block = None
                if not chosen and block_ms > 0:
                    block = block_ms
                    if deadline is not None:
                        block = max(1, min(block, int((deadline - time.monotonic()) * 1000)))
                try:
                    entries = await self._xreadgroup(group, consumer, stream, ">", room, block)
                except rexc.ResponseError as err:
                    if "NOGROUP" not in str(err):
                        raise
                    await self._ensure_group(stream, group)
                    continue
                if not entries:
                    break
                for raw_id, fields in entries:
                    keep(_s(raw_id), fields, 1, True)
                block_ms = 0  # block at most once per call
            rk = self.keys(req.run_id)
            payloads = await self._mget([rk.rec(c[1]) for c in chosen])
            nbytes = 0
            for (eid, _, count, fresh, source), payload in zip(chosen, payloads, strict=True):
                if payload is None:  # the record's payload expired (TTL): nothing to give
                    to_ack.append(eid)
                    continue
                d = out.deliveries.add(delivery_id=eid, delivery_count=count)
                d.record.ParseFromString(payload)
                nbytes += len(payload)
                if fresh:
                    key = (source, d.record.round)
                    taken[key] = taken.get(key, 0) + 1
            m.BYTES_OUT.labels("ROLLOUT").inc(nbytes)
            if to_ack:
                await self.r.xack(stream, group, *to_ack)
            if taken:
                await self._count_transfers(req.run_id, me, pb.ROLLOUT, taken)
        m.RECORDS_OUT.labels("ROLLOUT", "fetch").inc(len(out.deliveries))
        return out

    async def ack(self, run_id: str, policy_id: str, delivery_ids: Sequence[str]) -> int:
        run = await self.get_run(run_id)
        await self._check_policy(run, policy_id)
        if len(delivery_ids) > 65536:
            raise InvalidArgument("delivery_ids", "at most 65536 per call")
        for i, did in enumerate(delivery_ids):
            check_stream_id(did, f"delivery_ids[{i}]")
        if not delivery_ids:
            return 0
        async with redis_op("ack"):
            return int(await self.r.xack(self.keys(run_id).stream(pb.ROLLOUT), policy_id,
                                         *delivery_ids))

    async def _count_transfers(self, run_id: str, taker: str, kind: int,
                               taken: dict[tuple[str, int], int]) -> None:
        """Count delivered records: (source policy, record round) -> n (run totals and per
        round, in one transaction: transfers.py)."""
        rk = self.keys(run_id)
        ttl = self.retention(await self.get_run(run_id)).ttl_seconds
        async with self.r.pipeline(transaction=True) as pipe:
            transfers.queue_counts(pipe, rk, taker, kind, taken, ttl)
            await pipe.execute()

    # ---------------------------------------------------------------------------- round stats

    async def round_stats(self, req: pb.RoundStatsRequest, deadline: float | None = None
                          ) -> pb.RoundStatsResponse:
        """Pooled REWARD_STATS of a round; waits (polling) for expected policies until wait_ms
        or `deadline` (monotonic seconds) passes, then returns what exists."""
        run = await self.get_run(req.run_id)
        if req.round < 0:
            raise InvalidArgument("round", "must be >= 0")
        if not req.prompt_ids:
            raise InvalidArgument("prompt_ids", "at least one prompt id is required")
        if len(req.prompt_ids) > _MAX_PROMPTS:
            raise InvalidArgument("prompt_ids", f"at most {_MAX_PROMPTS} prompts")
        for i, p in enumerate(req.prompt_ids):
            if not p or "|" in p:
                raise InvalidArgument(f"prompt_ids[{i}]", "must be a non-empty prompt id")
        if req.policy_id:
            await self._check_policy(run, req.policy_id)
        for i, p in enumerate(req.expect_policies):
            await self._check_policy(run, p, f"expect_policies[{i}]")
        if not 0 <= req.wait_ms <= 60_000:
            raise InvalidArgument("wait_ms", "must lie in [0, 60000]")
        policies = list(run.config.policies)
        expected = list(req.expect_policies) or policies
        prompts = list(dict.fromkeys(req.prompt_ids))
        fields = [f"{p}|{pol}" for p in prompts for pol in policies]
        key = self.keys(req.run_id).round_stats(req.round)
        start = time.monotonic()
        stop_at = start + min(req.wait_ms, self.cfg.max_wait_ms) / 1000
        if deadline is not None:
            stop_at = min(stop_at, deadline)
        poll = self.cfg.poll_interval_ms / 1000
        while True:
            async with redis_op("round_stats"):
                values = await self.r.hmget(key, fields)
            have = {f: v for f, v in zip(fields, values, strict=True) if v is not None}
            missing = sorted({pol for p in prompts for pol in expected
                              if f"{p}|{pol}" not in have})
            now = time.monotonic()
            if not missing or now >= stop_at or self.stopping.is_set():
                break
            await asyncio.sleep(min(poll, max(0.0, stop_at - now)))
        m.ROUND_STATS_WAIT.observe(time.monotonic() - start)
        resp = pb.RoundStatsResponse(complete=not missing, missing_policies=missing)
        taken: dict[tuple[str, int], int] = {}
        for p in prompts:
            ps = resp.prompts.add(prompt_id=p)
            pooled = ps.pooled
            first = True
            for pol in policies:
                raw = have.get(f"{p}|{pol}")
                if raw is None:
                    continue
                c, s, ss, mx = _s(raw).split(",")
                st = pb.RewardStats(count=int(c), sum=float(s), sum_sq=float(ss), max=float(mx))
                ps.policies.add(policy_id=pol, stats=st)
                pooled.count += st.count
                pooled.sum += st.sum
                pooled.sum_sq += st.sum_sq
                pooled.max = st.max if first else max(pooled.max, st.max)
                first = False
                if req.policy_id and pol != req.policy_id:
                    taken[(pol, req.round)] = taken.get((pol, req.round), 0) + 1
        n_out = sum(taken.values())
        if taken:
            async with redis_op("round_stats"):
                await self._count_transfers(req.run_id, req.policy_id, pb.REWARD_STATS, taken)
        m.RECORDS_OUT.labels("REWARD_STATS", "round_stats").inc(n_out)
        return resp

    # ------------------------------------------------------------------------------ successes

    async def successes(self, req: pb.SuccessesRequest) -> pb.SuccessesResponse:
        """Peer VERIFIED_SUCCESS records per prompt, deduplicated by normalised text (the
        earliest round wins among equal texts), own successes excluded."""
        run = await self.get_run(req.run_id)
        await self._check_policy(run, req.policy_id)
        if not req.prompt_ids:
            raise InvalidArgument("prompt_ids", "at least one prompt id is required")
        if len(req.prompt_ids) > _MAX_PROMPTS:
            raise InvalidArgument("prompt_ids", f"at most {_MAX_PROMPTS} prompts")
        for i, p in enumerate(req.prompt_ids):
            if not p:
                raise InvalidArgument(f"prompt_ids[{i}]", "must be a non-empty prompt id")
        if req.max_per_prompt < 0:
            raise InvalidArgument("max_per_prompt", "must be >= 0")
        cap = req.max_per_prompt or 16
        prompts = list(dict.fromkeys(req.prompt_ids))
        rk = self.keys(req.run_id)
        me = req.policy_id
        async with redis_op("successes"), self.r.pipeline(transaction=False) as pipe:
            for p in prompts:
                pipe.hgetall(rk.successes(p))
            hashes = await pipe.execute()
        # Peer record ids per prompt, then their payloads in one MGET.
        wanted = [[_s(rid) for fld, rid in h.items() if _s(fld).split("|", 1)[0] != me]
                  for h in hashes]
        flat = [rid for rids in wanted for rid in rids]
        async with redis_op("successes"):
            payloads = await self._mget([rk.rec(rid) for rid in flat])
        by_id = {rid: pl for rid, pl in zip(flat, payloads, strict=True) if pl is not None}
        resp = pb.SuccessesResponse()
        taken: dict[tuple[str, int], int] = {}
        for p, rids in zip(prompts, wanted, strict=True):
            cands: list[pb.ExperienceRecord] = []
            for rid in rids:
                if rid not in by_id:
                    continue  # expired with its payload
                rec = pb.ExperienceRecord.FromString(by_id[rid])
                if rec.round < req.min_round:
                    continue
                cands.append(rec)
            cands.sort(key=lambda r: (r.round, r.created_unix_ms, r.policy_id, r.record_id))
            seen: set[str] = set()
            ps = resp.prompts.add(prompt_id=p)
            for rec in cands:
                norm = normalise_text(rec.text)
                if norm in seen:
                    continue
                seen.add(norm)
                ps.successes.append(rec)
                key = (rec.policy_id, rec.round)
                taken[key] = taken.get(key, 0) + 1
                m.BYTES_OUT.labels("VERIFIED_SUCCESS").inc(rec.ByteSize())
                if len(ps.successes) >= cap:
                    break
        if taken:
            async with redis_op("successes"):
                await self._count_transfers(req.run_id, me, pb.VERIFIED_SUCCESS, taken)
        m.RECORDS_OUT.labels("VERIFIED_SUCCESS", "successes").inc(sum(taken.values()))
        return resp

    # ------------------------------------------------------------------------------ subscribe

    async def subscribe(self, req: pb.SubscribeRequest, block_ms: int = 500
                        ) -> AsyncGenerator[pb.ExperienceEvent, None]:
        """Live events in stream-id order; ends when the store stops (or the caller cancels)."""
        await self.get_run(req.run_id)
        kinds: list[int] = [int(k) for k in dict.fromkeys(req.kinds)] or list(KINDS)
        for i, k in enumerate(kinds):
            if k not in KINDS:
                raise InvalidArgument(f"kinds[{i}]", f"unknown record kind {k}")
        rk = self.keys(req.run_id)
        if req.after_id:
            start = check_stream_id(req.after_id, "after_id")
        else:
            async with redis_op("subscribe"):
                last = await self._get(rk.lastid)
            start = _s(last) if last else "0-0"
        positions = {rk.stream(k): start for k in kinds}
        while not self.stopping.is_set():
            async with redis_op("subscribe"):
                reply = await self._xread(positions, 512, block_ms)
                if reply and len(positions) > 1:
                    # A blocked XREAD wakes up with the one stream that got data first; read the
                    # others now (one atomic snapshot) so a batch comes out in id order.
                    seen = {_s(stream): entries for stream, entries in reply}
                    rest = {k: (_s(seen[k][-1][0]) if k in seen else v)
                            for k, v in positions.items()}
                    reply = reply + await self._xread(rest, 512)
            found: list[tuple[tuple[int, int], str, str]] = []
            for stream, entries in reply:
                name = _s(stream)
                for eid, fields in entries:
                    sid = _s(eid)
                    positions[name] = max(positions[name], sid, key=_sid_key)
                    found.append((_sid_key(sid), sid, Header.of(fields).record_id))
            if not found:
                continue
            found.sort()
            async with redis_op("subscribe"):
                payloads = await self._mget([rk.rec(f[2]) for f in found])
            for (_, sid, _), payload in zip(found, payloads, strict=True):
                if payload is None:
                    continue
                ev = pb.ExperienceEvent(event_id=sid)
                ev.record.ParseFromString(payload)
                m.RECORDS_OUT.labels(kind_name(ev.record.kind), "subscribe").inc()
                yield ev

    # ----------------------------------------------------------------------------- inspection

    async def run_stats(self, run_id: str) -> pb.RunStats:
        run = await self.get_run(run_id)
        rk = self.keys(run_id)
        async with redis_op("run_stats"), self.r.pipeline(transaction=False) as pipe:
            pipe.hgetall(rk.counts)
            pipe.hgetall(rk.xfer)
            pipe.hgetall(rk.trimmed)
            for k in KINDS:
                pipe.xlen(rk.stream(k))
            counts, xfer, trimmed, *lens = await pipe.execute()
        out = pb.RunStats(run_id=run_id)
        per_policy: dict[str, dict[str, int]] = {p: {} for p in run.config.policies}
        for fld, val in counts.items():
            name = _s(fld)
            if name == "!dup":
                out.duplicates = int(val)
                continue
            policy, _, kind = name.rpartition("|")
            per_policy.setdefault(policy, {})[kind_name(int(kind))] = int(val)
        for policy, kinds in per_policy.items():
            pc = out.policies.add(policy_id=policy)
            for k in KINDS:
                pc.published[kind_name(k)] = kinds.get(kind_name(k), 0)
        for fld, val in sorted(xfer.items()):
            taker, source, kind = _s(fld).split("|")
            out.transfers.add(taker_policy=taker, source_policy=source, kind=int(kind),
                              count=int(val))
        for fld, val in trimmed.items():
            out.trimmed[_s(fld)] = int(val)
        for k, n in zip(KINDS, lens, strict=True):
            out.stream_lengths[kind_name(k)] = int(n)
        return out

    async def get_record(self, run_id: str, record_id: str) -> tuple[str, pb.ExperienceRecord]:
        await self.get_run(run_id)
        if not record_id:
            raise InvalidArgument("record_id", "required")
        rk = self.keys(run_id)
        async with redis_op("get_record"):
            loc = await self.r.hget(rk.idx, record_id)
            if loc is None:
                raise NotFound("record_id", f"record {record_id!r} not found in run {run_id!r}")
            _, _, sid = _s(loc).partition(":")
            payload = await self._get(rk.rec(record_id))
        if payload is None:
            raise NotFound("record_id", f"record {record_id!r} was removed by retention")
        return sid, pb.ExperienceRecord.FromString(payload)

    async def list_records(self, run_id: str, *, kinds: Iterable[int] = KINDS,
                           policy: str | None = None, prompt: str | None = None,
                           round_min: int | None = None, round_max: int | None = None,
                           verified: bool | None = None, cursor: str | None = None,
                           limit: int = 100, scan_budget: int = 20_000) -> RecordPage:
        """Records in stream-id order across the selected kinds, after `cursor` (exclusive).

        Filters run on the entries' plain fields; at most `scan_budget` entries are examined
        per call, so a sparse filter returns a short page with a cursor to continue from.
        """
        await self.get_run(run_id)
        if cursor:
            check_stream_id(cursor, "cursor")
        if not 1 <= limit <= 1000:
            raise InvalidArgument("limit", "must lie in [1, 1000]")
        rk = self.keys(run_id)
        streams = [rk.stream(k) for k in dict.fromkeys(kinds)]
        chunk = min(max(limit * 2, 64), 1024)
        pos = cursor or "0-0"
        out: list[tuple[str, str]] = []
        scanned = 0
        while True:
            async with redis_op("list_records"), self.r.pipeline(transaction=False) as pipe:
                for s in streams:
                    pipe.xrange(s, min=f"({pos}", max="+", count=chunk)
                replies = await pipe.execute()
            # Entries of the streams merged by id; only up to the smallest last id of a full
            # chunk is complete (a shorter stream may still hold entries beyond it).
            bound: tuple[int, int] | None = None
            merged: list[tuple[tuple[int, int], str, dict[bytes, bytes]]] = []
            for entries in replies:
                for eid, fields in entries:
                    sid = _s(eid)
                    a, b = sid.split("-")
                    merged.append(((int(a), int(b)), sid, fields))
                if len(entries) == chunk:
                    a, b = _s(entries[-1][0]).split("-")
                    last = (int(a), int(b))
                    bound = last if bound is None or last < bound else bound
            merged.sort(key=lambda x: x[0])
            exhausted = bound is None
            for key, sid, fields in merged:
                if bound is not None and key > bound:
                    break
                scanned += 1
                pos = sid
                h = Header.of(fields)
                if policy is not None and h.policy_id != policy:
                    continue
                if prompt is not None and h.prompt_id != prompt:
                    continue
                if (round_min is not None and h.round < round_min) or \
                        (round_max is not None and h.round > round_max):
                    continue
                if verified is not None and h.verified != verified:
                    continue
                out.append((sid, h.record_id))
                if len(out) >= limit:
                    return await self._page(rk, out, sid, scanned)
            if exhausted:
                return await self._page(rk, out, None, scanned)
            if scanned >= scan_budget:
                return await self._page(rk, out, pos, scanned)

    async def _page(self, rk: RunKeys, found: list[tuple[str, str]], cursor: str | None,
                    scanned: int) -> RecordPage:
        """Fetch the payloads of a page's records (one MGET)."""
        async with redis_op("list_records"):
            payloads = await self._mget([rk.rec(rid) for _, rid in found])
        return RecordPage([(sid, pb.ExperienceRecord.FromString(pl))
                           for (sid, _), pl in zip(found, payloads, strict=True)
                           if pl is not None], cursor, scanned)
