"""SEE against the real Redis and a real server on free ports: every RPC, each probe's read
path, idempotency, consumer restarts, deadlines, dedup, retention, subscribe."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import redis

from mutualrl.bench.testing.see import (
    TEST_PREFIX,
    make_config,
    rollout,
    running_see,
    stats_record,
    success_record,
)
from mutualrl.client.see import AsyncSeeClient, ClientOptions
from mutualrl.see.keys import RunKeys
from mutualrl.see.store.layout import HEADER_SEP, SUCCESS_ROUNDS_PER_TEXT
from mutualrl.v1 import experience_pb2 as pb


@pytest.fixture
async def see(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.delenv("MUTUALRL_AUTH_TOKEN", raising=False)
    async with running_see(make_config(redis_url)) as server:
        yield server


@pytest.fixture
async def client(see: Any) -> AsyncIterator[AsyncSeeClient]:
    async with AsyncSeeClient(ClientOptions(address=see.address, timeout=10)) as c:
        yield c


@pytest.fixture
def rds(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def keys(run_id: str) -> RunKeys:
    return RunKeys(TEST_PREFIX, run_id)


def live_strings(rds: redis.Redis, k: RunKeys) -> dict[str, int]:
    """The run's `blobs` hash: batch string id -> records of it still stored."""
    return {sid.decode(): int(n) for sid, n in rds.hgetall(k.blobs).items()}


def batch_strings(rds: redis.Redis, k: RunKeys) -> list[str]:
    """The run's batch string keys that exist."""
    return [b.decode() for b in rds.scan_iter(match=k.batch_prefix.replace("{", "[{]") + "*",
                                                 count=1000)]


async def test_create_get_list_runs(client: AsyncSeeClient, run_id: str) -> None:
    run = await client.create_run(run_id, ["a", "b"], tau=0.5, max_stream_len=500)
    assert list(run.config.policies) == ["a", "b"]
    assert run.config.tau == 0.5
    assert run.created_unix_ms > 0
    got = await client.get_run(run_id)
    assert got == run
    assert run_id in [r.config.run_id for r in await client.list_runs()]
    # Same config again: ALREADY_EXISTS unless exist_ok; a different config never.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.create_run(run_id, ["a", "b"], tau=0.5, max_stream_len=500)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    again = await client.create_run(run_id, ["a", "b"], tau=0.5, max_stream_len=500,
                                    exist_ok=True)
    assert again == run
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.create_run(run_id, ["a"], tau=0.5, exist_ok=True)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS


async def test_publish_and_fetch_rollouts_excludes_own_and_stale(
        client: AsyncSeeClient, run_id: str, rds: redis.Redis) -> None:
    await client.create_run(run_id, ["a", "b", "c"], tau=1.0)
    recs = ([rollout("a", r, f"p{i}", 0, n_tokens=8) for r in (0, 3) for i in range(3)]
            + [rollout("b", 3, "p0", 0), rollout("c", 3, "p1", 1, version=1)])
    resp = await client.publish(run_id, recs)
    assert (resp.stored, resp.duplicates) == (8, 0)
    assert [r.status for r in resp.results] == [pb.PUBLISH_STATUS_STORED] * 8
    assert rds.xlen(keys(run_id).stream(pb.ROLLOUT)) == 8

    # b sees a's and c's rollouts of round >= 2 with version >= 1; never its own.
    out = await client.fetch_rollouts(run_id, "b", "b-0", max_records=100, current_round=3,
                                      max_round_lag=1, min_policy_version=1)
    got = sorted(d.record.record_id for d in out.deliveries)
    assert got == ["a/3/p0/0", "a/3/p1/0", "a/3/p2/0", "c/3/p1/1"]
    assert out.skipped_stale == 3
    first = next(d for d in out.deliveries if d.record.record_id == "a/3/p0/0")
    assert first.delivery_count == 1
    assert first.record.run_id == run_id
    assert first.record.created_unix_ms > 0
    assert first.record.token_ids_i32 == recs[3].token_ids_i32
    assert first.record.logprobs_f32 == recs[3].logprobs_f32
    assert await client.ack(run_id, "b", [d.delivery_id for d in out.deliveries]) == 4
    again = await client.fetch_rollouts(run_id, "b", "b-0", max_records=100)
    assert len(again.deliveries) == 0

    # a's group is independent: it gets b's and c's records only.
    a_got = await client.take_peer_rollouts(run_id, "a", "a-0", max_records=100)
    assert sorted(r.record_id for r in a_got) == ["b/3/p0/0", "c/3/p1/1"]
    stats = await client.run_stats(run_id)
    xfer = {(t.taker_policy, t.source_policy, t.kind): t.count for t in stats.transfers}
    assert xfer == {("b", "a", pb.ROLLOUT): 3, ("b", "c", pb.ROLLOUT): 1,
                    ("a", "b", pb.ROLLOUT): 1, ("a", "c", pb.ROLLOUT): 1}


async def test_idempotent_republish(client: AsyncSeeClient, run_id: str,
                                    rds: redis.Redis) -> None:
    await client.create_run(run_id, ["a", "b"], tau=1.0)
    recs = [rollout("a", 0, f"p{i}", 0) for i in range(5)]
    first = await client.publish(run_id, recs)
    second = await client.publish(run_id, recs)
    assert (first.stored, first.duplicates) == (5, 0)
    assert (second.stored, second.duplicates) == (0, 5)
    assert {r.status for r in second.results} == {pb.PUBLISH_STATUS_DUPLICATE}
    # A batch that repeats an id inside itself stores it once.
    mixed = await client.publish(run_id, [rollout("a", 0, "p9", 0), rollout("a", 0, "p9", 0)])
    assert [r.status for r in mixed.results] == [pb.PUBLISH_STATUS_STORED,
                                                 pb.PUBLISH_STATUS_DUPLICATE]
    k = keys(run_id)
    assert rds.xlen(k.stream(pb.ROLLOUT)) == 6
    assert rds.hlen(k.idx) == 6
    stats = await client.run_stats(run_id)
    assert stats.duplicates == 6
    assert {p.policy_id: p.published["ROLLOUT"] for p in stats.policies} == {"a": 6, "b": 0}
    # One string per batch that stored something (the all-duplicate batch's was dropped at
    # once), each with the run's TTL and its count of live records; the first publish wins.
    live = live_strings(rds, k)
    assert sorted(live.values()) == [1, 5]
    batches = batch_strings(rds, k)
    assert sorted(batches) == sorted(k.batch(nonce) for nonce in live)
    assert all(rds.ttl(b) > 0 for b in batches)
    changed = rollout("a", 0, "p1", 0, reward=123.0)
    assert (await client.publish(run_id, [changed])).duplicates == 1
    # The index entry locates the record's bytes in its batch's string.
    kind, sid, nonce, offset, length = rds.hget(k.idx, changed.record_id).decode().split(":")
    first_loc = rds.hget(k.idx, recs[0].record_id).decode().split(":")
    assert first_loc[2:4] == [nonce, "0"]  # the batch's records one after another
    assert (int(kind), int(offset)) == (pb.ROLLOUT, int(first_loc[4]))
    assert sid == rds.xrange(k.stream(pb.ROLLOUT))[1][0].decode()
    stored = pb.ExperienceRecord.FromString(
        rds.getrange(k.batch(nonce), int(offset), int(offset) + int(length) - 1))
    assert stored.reward == recs[1].reward and stored.run_id == run_id


async def test_a_mixed_batch_has_a_string_per_kind_each_going_with_its_stream(
        client: AsyncSeeClient, run_id: str, rds: redis.Redis) -> None:
    """A batch's ROLLOUTs and its REWARD_STATS sit in separate strings: trimming the ROLLOUT
    stream frees the ROLLOUTs' bytes while the stats record (its stream untrimmed) keeps its
    own."""
    await client.create_run(run_id, ["a", "b"], tau=1.0, max_stream_len=20)
    k = keys(run_id)
    await client.publish(run_id, [*(rollout("a", 0, f"p{i}", i) for i in range(10)),
                                  stats_record("a", 0, "p0", [1.0, 0.0])])
    (loc_r,) = rds.hmget(k.idx, [rollout("a", 0, "p0", 0).record_id])
    (loc_s,) = rds.hmget(k.idx, [stats_record("a", 0, "p0", [1.0]).record_id])
    string_r, string_s = loc_r.decode().split(":")[2], loc_s.decode().split(":")[2]
    assert string_r[:-1] == string_s[:-1]  # one nonce, the kind after it
    assert (string_r[-1], string_s[-1]) == (str(pb.ROLLOUT), str(pb.REWARD_STATS))
    assert live_strings(rds, k) == {string_r: 10, string_s: 1}
    for start in (10, 20, 30):
        await client.publish(run_id, [rollout("a", 1, f"p{i}", i)
                                      for i in range(start, start + 10)])
    live = live_strings(rds, k)
    assert string_r not in live and not rds.exists(k.batch(string_r))
    assert live[string_s] == 1 and rds.exists(k.batch(string_s))
    assert sum(live.values()) == rds.hlen(k.idx) == rds.xlen(k.stream(pb.ROLLOUT)) + 1


async def test_records_written_before_batch_strings_are_served_and_trimmed(
        client: AsyncSeeClient, see: Any, run_id: str, rds: redis.Redis) -> None:
    """A run stored in the layout before batch strings (payload under `rec:<id>`, index entry
    "<kind>:<stream id>") carries on across the upgrade: its records are served, then trimmed
    with the rest."""
    await client.create_run(run_id, ["a", "b"], tau=1.0, max_stream_len=10)
    k = keys(run_id)
    old = rollout("a", 0, "old", 0)
    old.run_id = run_id
    rds.xadd(k.stream(pb.ROLLOUT),
             {"h": HEADER_SEP.join([old.record_id, "a", "old", "0", "0", "0"])}, id="1-0")
    rds.hset(k.idx, old.record_id, f"{pb.ROLLOUT}:1-0")
    rds.set(k.rec(old.record_id), old.SerializeToString(), ex=3600)
    rds.set(k.lastid, "1-0")
    new = rollout("a", 0, "new", 0)
    await client.publish(run_id, [new])
    got = await client.take_peer_rollouts(run_id, "b", "b-0", max_records=10)
    assert [r.record_id for r in got] == [old.record_id, new.record_id]
    assert got[0] == old
    sid, rec = await see.store.get_record(run_id, old.record_id)
    assert (sid, rec) == ("1-0", old)
    for start in (0, 10):
        await client.publish(run_id, [rollout("a", 1, f"n{i}", i)
                                      for i in range(start, start + 10)])
    # Trimmed like any record: its index entry and its payload key go.
    assert not rds.hexists(k.idx, old.record_id)
    assert not rds.exists(k.rec(old.record_id))
    assert rds.hlen(k.idx) == rds.xlen(k.stream(pb.ROLLOUT)) == 10


async def test_a_batch_whose_index_script_fails_keeps_the_payloads_it_indexed(
        client: AsyncSeeClient, run_id: str, rds: redis.Redis) -> None:
    """Redis does not roll a failed script back: records indexed before the error keep their
    payloads; a batch that indexed nothing leaves no string behind."""
    await client.create_run(run_id, ["a", "b"], tau=1.0)
    k = keys(run_id)
    rds.set(k.successes("bad"), "not a hash")  # the script's HEXISTS on it fails (WRONGTYPE)

    good = [rollout("a", 0, f"p{i}", i) for i in range(3)]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.publish(run_id, [*good, success_record("a", 0, "bad", "x = 1")])
    assert err.value.code() == grpc.StatusCode.INTERNAL  # a bug's error: logged, not detailed
    got = await client.take_peer_rollouts(run_id, "b", "b-0", max_records=10)
    assert [r.record_id for r in got] == [r.record_id for r in good]
    assert all(g.reward == r.reward and g.text == r.text for g, r in zip(got, good, strict=True))
    # Both strings of the batch (one per kind) stay: the success too was indexed (HSETNX comes
    # before its HEXISTS) when the script failed.
    kept = set(batch_strings(rds, k))
    pointed = {k.batch(loc.decode().split(":")[2]) for loc in rds.hvals(k.idx)}
    assert len(kept) == 2 and kept == pointed
    # Failing before its first record (the last issued id is not a string): nothing indexed,
    # the batch's string is deleted.
    rds.delete(k.lastid)
    rds.hset(k.lastid, "x", "1")
    with pytest.raises(grpc.aio.AioRpcError):
        await client.publish(run_id, [rollout("a", 0, "q", 0)])
    assert set(batch_strings(rds, k)) == kept
    assert not rds.hexists(k.idx, rollout("a", 0, "q", 0).record_id)


async def test_consumer_restart_redelivers_unacked(see: Any, run_id: str) -> None:
    opts = ClientOptions(address=see.address, timeout=10)
    async with AsyncSeeClient(opts) as c:
        await c.create_run(run_id, ["a", "b"], tau=1.0)
        await c.publish(run_id, [rollout("a", 0, f"p{i}", 0) for i in range(6)])
        got = await c.fetch_rollouts(run_id, "b", "trainer-b", max_records=4)
        assert len(got.deliveries) == 4
        await c.ack(run_id, "b", [got.deliveries[0].delivery_id])
    # The trainer "crashes" (client gone) and comes back under the same consumer name.
    async with AsyncSeeClient(opts) as c:
        again = await c.fetch_rollouts(run_id, "b", "trainer-b", max_records=10)
        ids = [d.delivery_id for d in again.deliveries]
        # Its three unacknowledged entries first (delivered twice now), then the 2 new ones.
        assert ids[:3] == [d.delivery_id for d in got.deliveries[1:]]
        assert [d.delivery_count for d in again.deliveries] == [2, 2, 2, 1, 1]
        assert len(set(d.record.record_id for d in again.deliveries)) == 5
        assert await c.ack(run_id, "b", ids) == 5
        assert len((await c.fetch_rollouts(run_id, "b", "trainer-b", max_records=10))
                   .deliveries) == 0


async def test_other_consumer_claims_idle_entries(client: AsyncSeeClient, run_id: str) -> None:
    await client.create_run(run_id, ["a", "b"], tau=1.0)
    await client.publish(run_id, [rollout("a", 0, f"p{i}", 0) for i in range(3)])
    lost = await client.fetch_rollouts(run_id, "b", "pod-1", max_records=10)
    assert len(lost.deliveries) == 3
    await asyncio.sleep(0.15)
    # A new pod name: without claim_idle_ms it gets nothing, with it it takes pod-1's entries.
    assert len((await client.fetch_rollouts(run_id, "b", "pod-2", max_records=10))
               .deliveries) == 0
    taken = await client.fetch_rollouts(run_id, "b", "pod-2", max_records=10, claim_idle_ms=100)
    assert sorted(d.delivery_id for d in taken.deliveries) == sorted(
        d.delivery_id for d in lost.deliveries)
    assert all(d.delivery_count == 2 for d in taken.deliveries)


async def test_fetch_blocks_until_a_peer_publishes(client: AsyncSeeClient, run_id: str) -> None:
    await client.create_run(run_id, ["a", "b"], tau=1.0)

    async def later() -> None:
        await asyncio.sleep(0.2)
        await client.publish(run_id, [rollout("a", 0, "p0", 0)])

    task = asyncio.ensure_future(later())
    start = time.monotonic()
    out = await client.fetch_rollouts(run_id, "b", "b-0", max_records=5, block_ms=3000)
    elapsed = time.monotonic() - start
    await task
    assert [d.record.record_id for d in out.deliveries] == ["a/0/p0/0"]
    assert 0.15 < elapsed < 2.5
    # Nothing more to come: a short block returns empty after about block_ms.
    await client.ack(run_id, "b", [out.deliveries[0].delivery_id])
    start = time.monotonic()
    empty = await client.fetch_rollouts(run_id, "b", "b-0", max_records=5, block_ms=200)
    assert len(empty.deliveries) == 0
    assert 0.15 < time.monotonic() - start < 1.5


async def test_round_stats_pool_and_wait(client: AsyncSeeClient, run_id: str) -> None:
    await client.create_run(run_id, ["a", "b", "c"], tau=1.0)
    await client.publish(run_id, [stats_record("a", 2, "p0", [1.0, 0.0, 1.0, 1.0]),
                                  stats_record("b", 2, "p0", [0.0, 0.0]),
                                  stats_record("a", 2, "p1", [0.5])])
    # c never publishes: the call returns after ~wait_ms with what exists.
    start = time.monotonic()
    resp = await client.round_stats(run_id, 2, ["p0", "p1"], policy_id="a", wait_ms=400)
    elapsed = time.monotonic() - start
    assert 0.35 <= elapsed < 1.2
    assert not resp.complete
    assert list(resp.missing_policies) == ["b", "c"]  # b lacks p1, c lacks both
    p0 = next(p for p in resp.prompts if p.prompt_id == "p0")
    assert {s.policy_id: s.stats.count for s in p0.policies} == {"a": 4, "b": 2}
    assert (p0.pooled.count, p0.pooled.sum, p0.pooled.sum_sq, p0.pooled.max) == (6, 3.0, 3.0,
                                                                                  1.0)
    # Only the expected policies count; all present -> immediate answer.
    start = time.monotonic()
    resp = await client.round_stats(run_id, 2, ["p0"], policy_id="a",
                                    expect_policies=["a", "b"], wait_ms=5000)
    assert resp.complete and time.monotonic() - start < 0.5

    # A peer that arrives during the wait ends it early.
    async def late_c() -> None:
        await asyncio.sleep(0.2)
        await client.publish(run_id, [stats_record("c", 2, "p0", [1.0])])

    task = asyncio.ensure_future(late_c())
    start = time.monotonic()
    resp = await client.round_stats(run_id, 2, ["p0"], policy_id="b", wait_ms=5000)
    await task
    assert resp.complete
    assert 0.15 < time.monotonic() - start < 2.0
    assert resp.prompts[0].pooled.count == 7
    stats = await client.run_stats(run_id)
    xfer = {(t.taker_policy, t.source_policy, t.kind): t.count for t in stats.transfers}
    assert xfer[("a", "b", pb.REWARD_STATS)] == 2
    assert xfer[("b", "c", pb.REWARD_STATS)] == 1


async def test_round_stats_never_outlives_the_client_deadline(see: Any, run_id: str) -> None:
    opts = ClientOptions(address=see.address, timeout=0.6, outage_budget=0)
    async with AsyncSeeClient(opts) as c:
        await c.create_run(run_id, ["a", "b"], tau=1.0)
        await c.publish(run_id, [stats_record("a", 0, "p0", [1.0])])
        start = time.monotonic()
        # wait_ms far beyond the deadline: the server answers just before the deadline.
        resp = await c.stub.GetRoundStats(
            pb.RoundStatsRequest(run_id=run_id, round=0, prompt_ids=["p0"], wait_ms=30_000),
            timeout=0.6)
        elapsed = time.monotonic() - start
    assert 0.4 < elapsed < 0.6
    assert not resp.complete and list(resp.missing_policies) == ["b"]


async def test_verified_successes_dedup(client: AsyncSeeClient, run_id: str) -> None:
    await client.create_run(run_id, ["a", "b", "c"], tau=1.0)
    await client.publish(run_id, [
        success_record("b", 1, "p0", "x = 2", 0),
        success_record("c", 2, "p0", "  x   =\n2 ", 0),  # same normalised text as b's
        success_record("c", 2, "p0", "x equals 2", 1),
        success_record("a", 1, "p0", "own answer", 0),
        success_record("b", 0, "p1", "y = 3", 0),
    ])
    got = await client.successes(run_id, "a", ["p0", "p1", "p2"])
    assert [r.text for r in got["p0"]] == ["x = 2", "x equals 2"]  # earliest round wins
    assert [r.policy_id for r in got["p0"]] == ["b", "c"]
    assert [r.text for r in got["p1"]] == ["y = 3"]
    assert got["p2"] == []
    assert all(r.verified and r.reward >= 1.0 for r in got["p0"])
    # b sees c's two texts and a's own answer; min_round and max_per_prompt apply.
    got_b = await client.successes(run_id, "b", ["p0"], min_round=2, max_per_prompt=1)
    assert [r.text for r in got_b["p0"]] == ["  x   =\n2 "]
    stats = await client.run_stats(run_id)
    xfer = {(t.taker_policy, t.source_policy, t.kind): t.count for t in stats.transfers}
    assert xfer == {("a", "b", pb.VERIFIED_SUCCESS): 2, ("a", "c", pb.VERIFIED_SUCCESS): 1,
                    ("b", "c", pb.VERIFIED_SUCCESS): 1}


async def test_a_text_given_again_later_keeps_its_earlier_round(client: AsyncSeeClient,
                                                                run_id: str) -> None:
    """A policy gives the same text for a prompt in rounds 0 and 2 (the prompt came back in a
    later epoch). A peer reading from round 0 (the deterministic mode reads round q while the
    policy may have published q + 2 already) gets the round-0 record, which its window holds;
    one reading from round 1 gets round 2's."""
    await client.create_run(run_id, ["a", "b"], tau=1.0)
    for i, r in enumerate((0, 2, 2)):  # two samples of round 2 say it: the round counts once
        await client.publish(run_id, [success_record("a", r, "p0", "7", sample=i)])
    await client.publish(run_id, [success_record("a", 4, "p0", "7"),
                                  success_record("a", 4, "p0", "8", sample=1)])
    got = await client.successes(run_id, "b", ["p0"], min_round=0)
    assert [(r.round, r.text) for r in got["p0"]] == [(0, "7"), (4, "8")]
    got = await client.successes(run_id, "b", ["p0"], min_round=1)
    assert [(r.round, r.text) for r in got["p0"]] == [(2, "7"), (4, "8")]
    got = await client.successes(run_id, "b", ["p0"], min_round=3)
    assert [(r.round, r.text) for r in got["p0"]] == [(4, "7"), (4, "8")]
    # The index remembers a text's latest SUCCESS_ROUNDS_PER_TEXT rounds.
    await client.publish(run_id, [success_record("a", r, "p0", "7") for r in range(5, 30)])
    got = await client.successes(run_id, "b", ["p0"], min_round=0)
    assert [(r.round, r.text) for r in got["p0"]] == [
        (4, "8"), (30 - SUCCESS_ROUNDS_PER_TEXT, "7")]


async def test_a_success_index_of_the_layout_before_carries_on(
        client: AsyncSeeClient, run_id: str, rds: redis.Redis) -> None:
    """A run indexed before (one bare record id per text) is read, and extended, as it is."""
    await client.create_run(run_id, ["a", "b"], tau=1.0)
    await client.publish(run_id, [success_record("a", 0, "p0", "7")])
    key = keys(run_id).successes("p0")
    (field, value), = rds.hgetall(key).items()
    assert value.decode().startswith("|0:")
    rds.hset(key, field, "a/0/p0/ok0")
    assert [r.round for r in (await client.successes(run_id, "b", ["p0"]))["p0"]] == [0]
    await client.publish(run_id, [success_record("a", 2, "p0", "7", sample=1)])
    assert rds.hget(key, field) == b"|?:a/0/p0/ok0|2:a/2/p0/ok1"
    got = await client.successes(run_id, "b", ["p0"], min_round=1)
    assert [r.round for r in got["p0"]] == [2]


async def test_retention_trims_counts_and_bounds_memory(client: AsyncSeeClient, run_id: str,
                                                        rds: redis.Redis) -> None:
    cap = 200
    await client.create_run(run_id, ["a", "b"], tau=1.0, max_stream_len=cap, max_rounds=3)
    k = keys(run_id)
    total = 10 * cap

    def run_memory() -> int:
        return sum(rds.memory_usage(key) or 0 for key in rds.scan_iter(match=f"*{run_id}*"))

    mem = []
    for start in range(0, total, 100):
        await client.publish(run_id, [rollout("a", i // 50, f"p{i % 50}", i, n_tokens=64)
                                      for i in range(start, start + 100)])
        if start + 100 in (2 * cap, total):
            mem.append(run_memory())
    held = rds.xlen(k.stream(pb.ROLLOUT))
    # Trimmed in amortised steps once cap + slack (cap/10) is passed: bounded by cap + slack.
    assert cap <= held <= cap + cap // 10
    stats = await client.run_stats(run_id)
    assert stats.trimmed["ROLLOUT"] == total - held
    assert stats.stream_lengths["ROLLOUT"] == held
    # The idempotency index and the batch strings shrink with the stream: a string goes once
    # none of its records is left.
    assert rds.hlen(k.idx) == held
    live = live_strings(rds, k)
    assert sum(live.values()) == held
    assert len(live) <= held // 100 + 1
    assert sorted(batch_strings(rds, k)) == sorted(k.batch(nonce) for nonce in live)
    assert mem[1] < 1.5 * mem[0], mem
    # A trimmed record is gone from the index (it could be published again).
    again = await client.publish(run_id, [rollout("a", 0, "p0", 0, n_tokens=64)])
    assert again.stored == 1
    # Rounds of REWARD_STATS beyond max_rounds are dropped and counted.
    await client.publish(run_id, [stats_record("a", r, "p0", [1.0]) for r in range(5)])
    assert sorted(int(x) for x in rds.zrange(k.rounds, 0, -1)) == [2, 3, 4]
    assert not rds.exists(k.round_stats(0)) and rds.exists(k.round_stats(4))
    assert (await client.run_stats(run_id)).trimmed["round_stats"] == 2
    assert 0 < rds.ttl(k.stream(pb.ROLLOUT)) <= 7 * 24 * 3600


async def test_subscribe_streams_live_records(client: AsyncSeeClient, run_id: str,
                                              see: Any) -> None:
    await client.create_run(run_id, ["a", "b"], tau=1.0)
    await client.publish(run_id, [rollout("a", 0, "old", 0)])  # before subscribing: not sent
    got: list[pb.ExperienceEvent] = []

    async def consume() -> None:
        async for ev in client.subscribe(run_id, kinds=[pb.ROLLOUT, pb.VERIFIED_SUCCESS]):
            got.append(ev)
            if len(got) == 3:
                return

    task = asyncio.ensure_future(consume())
    await asyncio.sleep(0.3)
    await client.publish(run_id, [rollout("a", 1, "p0", 0), stats_record("a", 1, "p0", [1.0]),
                                  success_record("b", 1, "p0", "z"), rollout("b", 1, "p1", 0)])
    await asyncio.wait_for(task, timeout=5)
    assert [e.record.record_id for e in got] == ["a/1/p0/0", "b/1/p0/ok0", "b/1/p1/0"]
    assert got[0].event_id < got[1].event_id < got[2].event_id
    # Replay from an id; and a server stop ends a live stream cleanly.
    replay = client.subscribe(run_id, after_id="0-0")
    first = await asyncio.wait_for(replay.__anext__(), timeout=5)
    assert first.record.record_id == "a/0/old/0"
    await replay.aclose()


async def test_subscribe_ends_when_server_stops(redis_url: str, run_id: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MUTUALRL_AUTH_TOKEN", raising=False)
    async with running_see(make_config(redis_url)) as server:
        c = AsyncSeeClient(ClientOptions(address=server.address, outage_budget=0))
        await c.create_run(run_id, ["a"], tau=1.0)
        call = c.stub.Subscribe(pb.SubscribeRequest(run_id=run_id))

        async def drain() -> str:
            try:
                async for _ in call:
                    pass
            except grpc.aio.AioRpcError as err:
                return err.code().name
            return "OK"

        task = asyncio.ensure_future(drain())
        await asyncio.sleep(0.3)
        assert not task.done()
        start = time.monotonic()
        await server.stop(2.0)
        code = await asyncio.wait_for(task, timeout=5)
        assert time.monotonic() - start < 3
        assert code in ("OK", "UNAVAILABLE", "CANCELLED")
        await c.close()


async def test_redis_down_is_unavailable_not_a_crash(monkeypatch: pytest.MonkeyPatch,
                                                     run_id: str) -> None:
    monkeypatch.delenv("MUTUALRL_AUTH_TOKEN", raising=False)
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    async with running_see(make_config(f"redis://127.0.0.1:{dead}/0")) as see:
        opts = ClientOptions(address=see.address, outage_budget=0, timeout=20)
        async with AsyncSeeClient(opts) as c:
            start = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.create_run(run_id, ["a"], tau=1.0)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "redis" in (err.value.details() or "")
            assert time.monotonic() - start < 15
        import httpx

        async with httpx.AsyncClient(base_url=see.rest_url) as h:
            health = await h.get("/healthz")
            assert health.status_code == 503 and health.json()["redis"] is False
            metrics = (await h.get("/metrics")).text
            assert "mutualrl_see_redis_errors_total" in metrics


async def test_health_and_reflection(see: Any) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async with grpc.aio.insecure_channel(see.address) as ch:
        reply = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="mutualrl.v1.ExperienceExchange"), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING

    def services() -> list[str]:
        from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
            ProtoReflectionDescriptorDatabase,
        )

        with grpc.insecure_channel(see.address) as ch:
            return list(ProtoReflectionDescriptorDatabase(ch).get_services())

    assert "mutualrl.v1.ExperienceExchange" in await asyncio.to_thread(services)
