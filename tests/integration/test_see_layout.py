"""SEE's storage format (`store/layout.py`): each layout's build and parse give each other back,
and what the publish script writes into Redis is exactly what the Python side builds."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mutualrl.bench.testing.see import make_config, rollout
from mutualrl.see.store import SeeStore
from mutualrl.see.store.layout import (
    ARGV,
    ARGV_LUA,
    Header,
    IndexEntry,
    PublishArgs,
    index_entry,
    parse_index_entry,
    stream_id,
    stream_id_key,
)
from mutualrl.see.store.lua import PUBLISH_LUA
from mutualrl.v1 import experience_pb2 as pb

TEXT = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=20)
UINT = st.integers(0, 2**63 - 1)


@given(TEXT, TEXT, TEXT, UINT, st.booleans(), UINT)
def test_a_header_reads_back(rid: str, policy: str, prompt: str, round_k: int, verified: bool,
                             version: int) -> None:
    h = Header(rid, policy, prompt, round_k, verified, version)
    assert Header.parse(h.build()) == h
    assert Header.of({b"h": h.build().encode()}) == h
    assert h.build().split("\x1f")[0] == rid  # the publish script's trim reads the id first


@given(st.integers(1, 3), UINT, UINT, st.text("0123456789abcdef", min_size=1, max_size=40),
       UINT, UINT)
def test_an_index_entry_reads_back(kind: int, ms: int, seq: int, string_id: str, off: int,
                                   length: int) -> None:
    sid = stream_id(ms, seq)
    assert stream_id_key(sid) == (ms, seq)
    entry = IndexEntry(kind, sid, string_id, off, length)
    assert parse_index_entry(entry.build().encode()) == entry
    assert index_entry(kind, sid, string_id, off, length) == entry.build()
    old = IndexEntry(kind, sid)  # the layout before batch strings
    assert parse_index_entry(old.build()) == old and old.string_id is None


@pytest.mark.parametrize("raw", [b"", b"1", b"x:1-0", b"1:1-0:abc", b"1:1-0:abc:4:x",
                                 b"1:1-0:a:1:2:3"])
def test_a_malformed_index_entry_is_an_error(raw: bytes) -> None:
    with pytest.raises(ValueError, match="malformed index entry"):
        parse_index_entry(raw)


def test_the_script_names_every_argument_from_the_one_list() -> None:
    args = PublishArgs(maxlen=10, ttl=60, max_rounds=5, max_succ=8, n=2, rs_prefix="rs:",
                       blob_prefix="b:", slack=1, rows="r", nonce="abc", old_prefix="rec:",
                       present="13")
    argv = args.argv()
    assert len(argv) == len(ARGV) and PublishArgs.parse(argv) == args
    assert PublishArgs.parse([str(v).encode() for v in argv]) == args
    with pytest.raises(ValueError, match="12 arguments"):
        PublishArgs.parse(argv[:-1])
    assert PUBLISH_LUA.startswith("\n" + ARGV_LUA)
    body = PUBLISH_LUA[len(ARGV_LUA) + 1:]
    assert "ARGV[" not in body  # every slot is read by name, from the prologue
    for i, name in enumerate(ARGV, 1):
        assert f"local {name} = " in ARGV_LUA and f"ARGV[{i}]" in ARGV_LUA


async def test_the_script_writes_the_entries_the_readers_parse(redis_url: str) -> None:
    prefix = f"lay{uuid.uuid4().hex[:8]}"
    store = SeeStore(make_config(redis_url, key_prefix=prefix))
    try:
        await store.create_run(pb.RunConfig(run_id="lay", policies=["a", "b"]))
        records = [rollout("a", 0, f"p{i}", 0) for i in range(3)]
        resp = await store.publish("lay", records)
        assert resp.stored == 3
        rk = store.keys("lay")
        offset = 0
        for rec in records:
            raw = await store.r.hget(rk.idx, rec.record_id)
            entry = parse_index_entry(raw)
            assert entry.kind == pb.ROLLOUT and entry.offset == offset
            assert entry.length == len(rec.SerializeToString())
            assert entry.build().encode() == raw  # the script's string is the builder's
            offset += entry.length
            sid, back = await store.get_record("lay", rec.record_id)
            assert sid == entry.stream_id and back.record_id == rec.record_id
        again = await store.publish("lay", records[:1])  # one path: idempotent as the RPC's
        assert (again.stored, again.duplicates) == (0, 1)
    finally:
        await store.delete_run("lay")
        await store.close()
