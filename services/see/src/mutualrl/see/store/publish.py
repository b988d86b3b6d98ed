"""Publish: store a validated batch in one MULTI/EXEC (the batch's payloads, then the index
script).

Through redis-py's public API only: a transaction pipeline carries a SET of the batch's payloads
of each record kind as one string (with the run's TTL) and EVALSHA of the index script
(`lua.py`, registered with `register_script`), which indexes each new record as a range of its
string.
Redis runs the transaction as one unit, so a record is never half stored and the reply only
comes back once every record is in Redis; all keys share the run's hash tag, so a cluster runs
it on one node.

EVALSHA rather than the script object's own call: inside MULTI, the script object's
load-if-missing would cost a SCRIPT EXISTS round trip per Publish. A NOSCRIPT error (script cache
flushed, e.g. a restarted or failed-over Redis) only comes back after the SET was applied; the
batch then runs again, after loading the script, under the same keys (the SETs overwrite them
with the same bytes), and idempotency is decided by the script's index, so nothing is stored twice.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Sequence
from typing import Any

from redis import exceptions as rexc

from mutualrl.common.errors import Unavailable
from mutualrl.common.records import Batch
from mutualrl.see import metrics as m
from mutualrl.see.keys import KINDS, RunKeys, kind_name
from mutualrl.see.store.durability import Mode
from mutualrl.see.store.entries import redis_op
from mutualrl.see.store.layout import (
    Header,
    PublishArgs,
    as_str,
    batch_rows,
    batch_string_id,
    parse_index_entry,
    record_row,
    stats_aux,
    success_aux,
)
from mutualrl.see.store.lua import PUBLISH_LUA
from mutualrl.see.store.runs import RunRegistry, queue_round
from mutualrl.see.validate import text_digest
from mutualrl.v1 import experience_pb2 as pb

# How long a Publish waits for its batch to reach the disk under see.durability=fsync.
_WAITAOF_TIMEOUT_MS = 5_000
_STORED, _DUPLICATE = pb.PUBLISH_STATUS_STORED, pb.PUBLISH_STATUS_DUPLICATE


def publish_response(record_ids: Sequence[str], flags: str) -> pb.PublishResponse:
    """The answer to a Publish: one result per record, in input order (`flags` as `publish`
    returns them), and the counts."""
    resp = pb.PublishResponse()
    add = resp.results.add  # (cheaper than building a list of PublishResult messages)
    for rid, flag in zip(record_ids, flags, strict=True):
        add(record_id=rid, status=_STORED if flag == "1" else _DUPLICATE)
    resp.stored = flags.count("1")
    resp.duplicates = len(flags) - resp.stored
    return resp


class Publisher:
    def __init__(self, runs: RunRegistry) -> None:
        self.runs = runs
        self.script = runs.r.register_script(PUBLISH_LUA)
        self.mode = Mode.REDIS
        """Set at start from `see.durability` (durability.py)."""

    async def publish(self, run: pb.Run, records: Sequence[pb.ExperienceRecord], batch: Batch
                      ) -> tuple[list[str], str]:
        """Store validated records of `run` (`batch`: their fields, from `validate_records`):
        (record ids, flags) with flag "1" for newly stored and "0" for a duplicate, in input
        order. The records get their run_id and created_unix_ms set."""
        if not records:
            return [], ""
        run_id = run.config.run_id
        ret = self.runs.retention(run)
        rk = self.runs.keys(run_id)
        limits = self.runs.cfg.limits
        keys = rk.fixed()
        aux_keys: dict[str, int] = {}
        now_ms = int(time.time() * 1000)
        nonce = uuid.uuid4().hex
        ids, kinds = batch.record_id, batch.kind
        payloads: list[bytes] = []
        rows: list[str] = []
        for i, (rec, rid, kind, policy, prompt, round_, verified, version) in enumerate(zip(
                records, ids, kinds, batch.policy_id, batch.prompt_id, batch.round,
                batch.verified, batch.policy_version, strict=True)):
            rec.run_id = run_id
            rec.created_unix_ms = now_ms
            payload = rec.SerializeToString()
            payloads.append(payload)
            header = Header(rid, policy, prompt, round_, verified, version)
            aux = ""
            if kind != pb.ROLLOUT:
                key = (rk.round_stats(round_) if kind == pb.REWARD_STATS
                       else rk.successes(prompt))
                idx = aux_keys.get(key)
                if idx is None:
                    keys.append(key)
                    idx = aux_keys[key] = len(keys)
                if kind == pb.REWARD_STATS:
                    aux = stats_aux(idx, prompt, policy, rec.stats, round_)
                else:
                    aux = success_aux(idx, policy, text_digest(batch.text[i]))
            rows.append(record_row(rid, kind, len(payload), header, aux))
        sizes = list(map(len, payloads))
        present = sorted(set(kinds))
        if len(present) == 1:
            strings = [(rk.batch(batch_string_id(nonce, present[0])), b"".join(payloads))]
        else:
            by_kind: dict[int, list[bytes]] = {}
            for kind, payload in zip(kinds, payloads, strict=True):
                by_kind.setdefault(kind, []).append(payload)
            strings = [(rk.batch(batch_string_id(nonce, k)), b"".join(by_kind[k]))
                       for k in present]
        args = PublishArgs(
            maxlen=ret.max_stream_len, ttl=ret.ttl_seconds, max_rounds=ret.max_rounds,
            max_succ=limits.max_successes_per_prompt, n=len(records),
            rs_prefix=rk.round_stats_prefix, blob_prefix=rk.batch_prefix,
            # Trim once a stream is this far past its cap (amortises the trim like MAXLEN ~).
            slack=max(1, min(100, ret.max_stream_len // 10)), rows=batch_rows(rows),
            nonce=nonce, old_prefix=rk.rec_prefix, present="".join(map(str, present))
        ).argv()
        top = max(batch.round)
        async with redis_op("publish"):
            reply = await self._transaction(strings, ret.ttl_seconds, keys, args, ids,
                                            (rk, top))
        self.runs.raised_round(run_id, top)
        flags = as_str(reply[0])
        if "0" not in flags and len(present) == 1:
            # The common batch: one kind, nothing duplicated.
            tally = {(kinds[0], True): [len(kinds), sum(sizes)]}
        else:
            tally = {}
            for k, flag, size in zip(kinds, flags, sizes, strict=True):
                t = tally.setdefault((k, flag == "1"), [0, 0])
                t[0] += 1
                t[1] += size
        for (k, stored), (count, nbytes) in tally.items():
            name = kind_name(k)
            m.RECORDS_IN.labels(name, "stored" if stored else "duplicate").inc(count)
            if stored:
                m.BYTES_IN.labels(name).inc(nbytes)
        for k, tr in zip(KINDS, reply[1:4], strict=True):
            if int(tr):
                m.TRIMMED.labels(kind_name(k)).inc(int(tr))
        if int(reply[4]):
            m.TRIMMED.labels("round_stats").inc(int(reply[4]))
        m.PUBLISH_BATCH.observe(len(records))
        return ids, flags

    async def _transaction(self, strings: list[tuple[str, bytes]], ttl: int, keys: list[str],
                           args: Sequence[bytes | str | int], record_ids: list[str],
                           top: tuple[RunKeys, int]) -> Any:
        """The MULTI/EXEC (a SET of each (key, payloads) of `strings`, the raise of the run's
        current round to the batch's highest, `top`, then the index script); returns the
        script's reply."""
        for attempt in (0, 1):
            if self.mode is Mode.WAITAOF:
                replies = await self._transaction_waitaof(strings, ttl, keys, args, top)
            else:
                async with self.runs.r.pipeline(transaction=True) as pipe:
                    for key, data in strings:
                        pipe.set(key, data, ex=ttl)
                    queue_round(pipe, *top, ttl)
                    pipe.execute_command("EVALSHA", self.script.sha, len(keys), *keys, *args)
                    replies = await pipe.execute(raise_on_error=False)
            *set_replies, reply = replies
            if isinstance(reply, rexc.NoScriptError) and attempt == 0:
                await self._load_script()
                continue
            if isinstance(reply, Exception) and not any(isinstance(r, Exception)
                                                        for r in set_replies):
                with contextlib.suppress(rexc.RedisError):
                    # (keys[1]: the id index, the script's KEYS[2])
                    await self._drop_unreferenced([k for k, _ in strings], keys[1], record_ids)
            for r in replies:
                if isinstance(r, Exception):
                    raise r
            return reply
        raise AssertionError("unreachable")  # pragma: no cover

    async def _drop_unreferenced(self, string_keys: list[str], idx: str,
                                 record_ids: list[str]) -> None:
        """After the index script failed: a script is not rolled back, so the records it indexed
        before the error point into their strings. Delete the strings none points into; the
        others stay, and go with their records or with the run's TTL."""
        locs = await self.runs.r.hmget(idx, record_ids)
        used = {e.string_id for e in (parse_index_entry(loc) for loc in locs if loc is not None)
                if e.string_id is not None}
        unused = [k for k in string_keys if k.rpartition(":")[2] not in used]
        if unused:
            await self.runs.r.delete(*unused)

    async def _transaction_waitaof(self, strings: list[tuple[str, bytes]], ttl: int,
                                   keys: list[str], args: Sequence[bytes | str | int],
                                   top: tuple[RunKeys, int]) -> list[Any]:
        """The same MULTI/EXEC, then WAITAOF on the same connection (it waits for that
        connection's writes): the replies of the SETs and the script, once fsynced."""
        async with self.runs.r.pipeline(transaction=False) as pipe:
            pipe.execute_command("MULTI")
            for key, data in strings:
                pipe.set(key, data, ex=ttl)
            queue_round(pipe, *top, ttl)
            pipe.evalsha(self.script.sha, len(keys), *keys, *args)
            pipe.execute_command("EXEC")
            pipe.execute_command("WAITAOF", 1, 0, _WAITAOF_TIMEOUT_MS)
            replies = await pipe.execute(raise_on_error=False)
        exec_reply, waited = replies[-2], replies[-1]
        if isinstance(exec_reply, Exception):
            raise exec_reply
        if isinstance(waited, Exception):
            raise waited
        if int(waited[0]) < 1:
            raise Unavailable("records", "Redis did not fsync the batch within "
                                         f"{_WAITAOF_TIMEOUT_MS} ms (see.durability=fsync)")
        return list(exec_reply)

    async def _load_script(self) -> None:
        # A cluster client sends SCRIPT LOAD to every primary; a plain one to its server.
        await self.runs.r.script_load(PUBLISH_LUA)
