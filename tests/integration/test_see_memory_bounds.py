"""SEE's memory is bounded whatever clients send: the run-config cache, the Publish bytes worked
on at once, and every answer that carries records, which is sized from the index before it is
read and ends early at the byte budget with a continuation.

- `test_verified_successes_take_one_records_bytes_at_max_per_prompt_1`: a `mutualrl see serve`
  process answers GetVerifiedSuccesses over 100 candidates of 1 MiB at max_per_prompt=1 with its
  resident memory growing by less than `SUCCESS_GROWTH_BOUND` (the answer: one record), where it
  once loaded every candidate (+382 MB);
- `test_a_256_record_answer_comes_in_pages_within_the_budget`: 256 successes of one prompt come
  in pages of at most the budget each, every one once, in answer order, and the SDK joins them;
- the same for FetchRollouts (`more`), GetRoundStats, GetRunStats and ListRuns pages.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from mutualrl.bench.testing.process import reset_peak, status, stop
from mutualrl.bench.testing.see import (
    make_config,
    rollout,
    running_see,
    stats_record,
    success_record,
)
from mutualrl.client.see import AsyncSeeClient, ClientOptions, SeeClient
from mutualrl.v1 import experience_pb2 as pb
from mutualrl.v1 import experience_pb2_grpc as pb_grpc

MiB = 1 << 20
RECORD_BYTES = 8192
BUDGET = 80_000
"""The answers' byte budget of the in-process SEE below (its floor: a record and 64 KiB)."""
SUCCESS_GROWTH_BOUND = 16 * MiB
"""SEE's resident growth while it answers one 1 MiB success out of 100 (the answer and its
serialized copy, the index and stream reads of 100 candidates)."""


@pytest.fixture
async def see(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.delenv("MUTUALRL_AUTH_TOKEN", raising=False)
    cfg = make_config(redis_url, limits={
        "max_cached_runs": 8, "max_record_bytes": RECORD_BYTES, "max_text_chars": 4096,
        "max_response_bytes": BUDGET}, max_inflight_request_bytes=200_000,
        request_wait_seconds=0)
    async with running_see(cfg) as s:
        yield s


@pytest.fixture
async def client(see: Any) -> AsyncIterator[AsyncSeeClient]:
    async with AsyncSeeClient(ClientOptions(address=see.address, outage_budget=0)) as c:
        yield c


@pytest.fixture
async def stub(see: Any) -> AsyncIterator[pb_grpc.ExperienceExchangeStub]:
    """A raw stub: what each page carries on the wire."""
    async with grpc.aio.insecure_channel(see.address) as channel:
        yield pb_grpc.ExperienceExchangeStub(channel)


async def test_run_cache_is_bounded(see: Any, client: AsyncSeeClient, run_id: str) -> None:
    """The run cache kept every run ever created or read: it grew without bound."""
    ids = [f"{run_id}-{i}" for i in range(30)]
    try:
        for rid in ids:
            await client.create_run(rid, ["a"])
            await client.fetch_rollouts(rid, "a", "w", max_records=1)  # reads the run
            assert see.store.runs.cached <= 8
        for i in range(200):  # unknown runs are never cached
            with pytest.raises(grpc.RpcError):
                await client.fetch_rollouts(f"{run_id}-missing-{i}", "a", "w")
        assert see.store.runs.cached <= 8
    finally:
        for rid in ids:
            await client.delete_run(rid)


async def test_publish_bytes_in_flight_are_bounded(see: Any, client: AsyncSeeClient,
                                                   run_id: str) -> None:
    await client.create_run(run_id, ["a", "b"])
    batch = [rollout("a", 0, f"p{i}", 0, n_tokens=300) for i in range(8)]  # ~40 kB
    budget = see.grpc.budget
    await budget.acquire(190_000)  # as if other calls were being worked on
    try:
        with pytest.raises(grpc.RpcError) as err:
            await client.publish(run_id, batch)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_inflight_request_bytes" in err.value.details()
        assert "200000 B" in err.value.details()
    finally:
        budget.release(190_000)
    assert budget.in_use == 0
    assert (await client.publish(run_id, batch)).stored == 8
    for _ in range(100):  # given back once the answer has been sent
        if budget.in_use == 0:
            break
        await asyncio.sleep(0.01)
    assert budget.in_use == 0


async def test_one_fetch_answer_is_bounded(client: AsyncSeeClient,
                                           stub: pb_grpc.ExperienceExchangeStub,
                                           run_id: str) -> None:
    """max_records=4096 of 1 MB records would have built a 4 GB answer; now a page is at most
    the budget, says `more`, and the rest comes first in the next fetch."""
    await client.create_run(run_id, ["a", "b"])
    recs = [rollout("a", 0, f"p{i}", 0, n_tokens=300) for i in range(30)]
    size = len(recs[0].SerializeToString())
    assert 4_000 < size < 8_000  # so at most 19 fit the 80 kB answer
    await client.publish(run_id, recs)
    seen: list[str] = []
    for k in range(5):
        got = await stub.FetchRollouts(pb.FetchRolloutsRequest(
            run_id=run_id, policy_id="b", consumer="w", max_records=4096))
        assert got.ByteSize() <= BUDGET
        ids = [d.record.record_id for d in got.deliveries]
        if k == 0:
            assert 1 <= len(ids) < 30 and got.more, len(ids)
        seen += ids
        if ids:
            await client.ack(run_id, "b", [d.delivery_id for d in got.deliveries])
        if not got.more:
            break
    assert sorted(seen) == sorted(r.record_id for r in recs)  # each once, none lost
    # take_peer_rollouts follows `more` itself.
    more = [rollout("a", 1, f"p{i}", 0, n_tokens=300) for i in range(30)]
    await client.publish(run_id, more)
    taken = await client.take_peer_rollouts(run_id, "b", "w", max_records=4096)
    assert sorted(r.record_id for r in taken) == sorted(r.record_id for r in more)


async def test_a_256_record_answer_comes_in_pages_within_the_budget(
        client: AsyncSeeClient, stub: pb_grpc.ExperienceExchangeStub, run_id: str) -> None:
    await client.create_run(run_id, ["a", "b", "c"], tau=0.5)
    texts = [f"answer {i:03d} " + "x" * 2000 for i in range(256)]
    # Rounds and policies interleave, so the answer order (round, policy, record id) is not
    # the publish order; a duplicate text of a later round is dropped by deduplication.
    recs = [success_record("ab"[i % 2], i % 7, "q", t, sample=i) for i, t in enumerate(texts)]
    recs.append(success_record("a", 9, "q", texts[3], sample=999))
    recs.append(success_record("b", 0, "q2", "other prompt", sample=1))
    for i in range(0, len(recs), 64):
        await client.publish(run_id, recs[i:i + 64])
    req = pb.SuccessesRequest(run_id=run_id, policy_id="c", prompt_ids=["q", "q2", "q3"],
                              max_per_prompt=256)
    pages: list[pb.SuccessesResponse] = []
    while True:
        page = await stub.GetVerifiedSuccesses(req)
        assert page.ByteSize() <= BUDGET, page.ByteSize()
        pages.append(page)
        if not page.next_page_token:
            break
        req.page_token = page.next_page_token
    assert len(pages) >= 6  # 256 x ~2.1 kB in 80 kB pages
    got = [r for p in pages for ps in p.prompts if ps.prompt_id == "q" for r in ps.successes]
    expected = sorted((r for r in recs[:256]), key=lambda r: (r.round, r.policy_id, r.record_id))
    assert [r.record_id for r in got] == [r.record_id for r in expected]
    assert [ps.prompt_id for ps in pages[-1].prompts][-2:] == ["q2", "q3"]
    # The SDK joins the pages.
    joined = await client.successes(run_id, "c", ["q", "q2", "q3"], max_per_prompt=256)
    assert [r.record_id for r in joined["q"]] == [r.record_id for r in expected]
    assert [r.text for r in joined["q2"]] == ["other prompt"] and joined["q3"] == []
    # A token is this request's only.
    with pytest.raises(grpc.RpcError) as err:
        await stub.GetVerifiedSuccesses(pb.SuccessesRequest(
            run_id=run_id, policy_id="c", prompt_ids=["q"], max_per_prompt=1,
            page_token=pages[0].next_page_token))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith("page_token:")


async def test_round_stats_run_stats_and_runs_come_in_pages(
        see: Any, client: AsyncSeeClient, stub: pb_grpc.ExperienceExchangeStub,
        run_id: str) -> None:
    policies = [f"p{i:02d}-" + "n" * 100 for i in range(12)]
    await client.create_run(run_id, policies)
    prompts = [f"prompt-{i:04d}-" + "z" * 100 for i in range(300)]
    for p in policies:
        await client.publish(run_id, [stats_record(p, 0, q, [0.0, 1.0]) for q in prompts])
    req = pb.RoundStatsRequest(run_id=run_id, round=0, prompt_ids=prompts)
    seen: list[str] = []
    while True:
        page = await stub.GetRoundStats(req)
        assert page.ByteSize() <= BUDGET and page.complete
        seen += [ps.prompt_id for ps in page.prompts]
        for ps in page.prompts:
            assert (ps.pooled.count, ps.pooled.sum) == (24, 12.0)
        if not page.next_page_token:
            break
        req.page_token = page.next_page_token
    assert seen == prompts
    whole = await client.round_stats(run_id, 0, prompts)
    assert [p.prompt_id for p in whole.prompts] == prompts and whole.complete
    # Every policy takes from every other: 12 x 11 transfer counts of long names, in pages.
    for p in policies:
        await client.round_stats(run_id, 0, prompts[:1], policy_id=p)
    stats = await stub.GetRunStats(pb.RunStatsRequest(run_id=run_id))
    assert stats.ByteSize() <= BUDGET
    joined = await client.run_stats(run_id)
    assert len(joined.transfers) == 12 * 11
    assert sorted((t.taker_policy, t.source_policy) for t in joined.transfers) == sorted(
        (a, b) for a in policies for b in policies if a != b)
    # Runs: pages of at most page_size, in id order, all of them once.
    ids = [f"{run_id}-r{i:03d}" for i in range(25)]
    try:
        for rid in ids:
            await client.create_run(rid, policies)
        listed: list[str] = []
        token = ""
        while True:
            page = await stub.ListRuns(pb.ListRunsRequest(page_size=7, page_token=token))
            assert len(page.runs) <= 7 and page.ByteSize() <= BUDGET
            listed += [r.config.run_id for r in page.runs]
            token = page.next_page_token
            if not token:
                break
        assert [r for r in listed if r.startswith(run_id)] == sorted([run_id, *ids])
        assert len(listed) == len(set(listed))
        assert {r.config.run_id for r in await client.list_runs()} >= set(ids)
    finally:
        for rid in ids:
            await client.delete_run(rid)


# ---- a SEE process of its own: its resident memory ----------------------------------------


@pytest.fixture
def see_process(tmp_path: Path, redis_url: str, run_id: str) -> Iterator[tuple[int, str]]:
    """(pid, address) of a `mutualrl see serve` with SEE's default limits."""
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps({"see": {"port": 0, "rest_port": None, "metrics_port": None,
                                          "redis_url": redis_url, "key_prefix": run_id}}),
                      encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-m", "mutualrl.cli", "--log-level", "WARNING",
                             "see", "serve", "--config", str(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True,
                            env={"PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        found = re.search(r"SEE listening on \S+:(\d+)", proc.stdout.readline())
        assert found
        yield proc.pid, f"127.0.0.1:{found.group(1)}"
    finally:
        stop(proc)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_verified_successes_take_one_records_bytes_at_max_per_prompt_1(
        see_process: tuple[int, str], run_id: str) -> None:
    pid, address = see_process
    options = ClientOptions(address=address, outage_budget=0, timeout=120)
    text = "\U0001f389" * 261_000  # 1,044,000 bytes: a record just under SEE's 1 MiB
    with SeeClient(options) as see:
        see.create_run(run_id, ["a", "b", "c"], tau=0.5)
        recs = [success_record("ab"[i % 2], i, "q", f"{i:03d}{text}", sample=i)
                for i in range(100)]
        for i in range(0, 100, 20):
            see.publish(run_id, recs[i:i + 20])
        see.successes(run_id, "c", ["q0"], max_per_prompt=1)  # warm: the code paths, a page
        before = status(pid, "VmRSS")
        # VmHWM is the process's high-water mark since start: reset it to its RSS now.
        reset_peak(pid)
        got = see.successes(run_id, "c", ["q"], max_per_prompt=1)
        growth = status(pid, "VmHWM") - before
        assert [r.record_id for r in got["q"]] == [recs[0].record_id]
        print(f"SEE RSS {before / MiB:.0f} MiB; growth answering 1 of 100 x 1 MiB "
              f"successes: {growth / MiB:.1f} MiB (bound {SUCCESS_GROWTH_BOUND / MiB:.0f})")
        assert growth < SUCCESS_GROWTH_BOUND, growth / MiB
        # All 100 at max_per_prompt=256: pages within SEE's 32 MiB budget, none lost.
        every = see.successes(run_id, "c", ["q"], max_per_prompt=256)
        assert [r.record_id for r in every["q"]] == [r.record_id for r in recs]
