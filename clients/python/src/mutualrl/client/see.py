"""Clients of the Shared Experience Exchange: `SeeClient` (blocking) and `AsyncSeeClient`.

Every RPC retries UNAVAILABLE for as long as the options' outage budget (a restarting SEE or a
Redis hiccup costs a delay, not a crash; `mutualrl.client.base`). The reads take `timeout=`,
the deadline of each attempt, and `outage_budget=`, the call's own budget: a read bounded by
what is left of a training round passes that as both, so an outage ends it by then. SEE answers
in pages of at most its byte budget; the reads here follow the continuations
(`next_page_token`), each page an attempt of its own, and return the whole answer, so nothing is
cut silently. `fetch_rollouts` returns one page (its `more` says entries wait);
`take_peer_rollouts` fetches until none does.
Retrying Publish is safe: records are idempotent by record_id, so a batch whose answer was lost
stores nothing twice (the retry reports DUPLICATE for those). `subscribe` re-opens its stream
after the last event it delivered.

    with SeeClient("127.0.0.1:50051") as see:
        see.create_run("run1", ["a", "b"], tau=1.0, exist_ok=True)
        see.publish("run1", records)
        records = see.take_peer_rollouts("run1", "a", consumer="trainer-a", current_round=3,
                                         max_round_lag=1)
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any

import grpc

from mutualrl.client.base import AsyncClient, Client, Target
from mutualrl.client.blocking import blocking, blocking_stream
from mutualrl.common.channel import ClientOptions
from mutualrl.v1 import experience_pb2 as pb
from mutualrl.v1 import experience_pb2_grpc as pb_grpc
from mutualrl.v1 import run_metrics_pb2 as mpb
from mutualrl.v1 import run_metrics_pb2_grpc as mpb_grpc

MAX_BATCH = 4096
MAX_METRIC_ROWS = 1024
DEFAULT_ADDRESS = "127.0.0.1:50051"

__all__ = ["AsyncSeeClient", "ClientOptions", "SeeClient", "metric_row", "pb"]


def _run_config(run_id: str, policies: Sequence[str], tau: float, max_stream_len: int,
                ttl_seconds: int, max_rounds: int) -> pb.RunConfig:
    return pb.RunConfig(run_id=run_id, policies=list(policies), tau=tau,
                        retention=pb.Retention(max_stream_len=max_stream_len,
                                               ttl_seconds=ttl_seconds, max_rounds=max_rounds))


def metric_row(policy_id: str, round_: int, values: dict[str, float],
               unix_ms: int = 0) -> mpb.MetricRow:
    """One policy's metrics of one round, for `report_metrics` (unix_ms 0: SEE stamps it)."""
    return mpb.MetricRow(policy_id=policy_id, round=round_, values=values, unix_ms=unix_ms)


def _metric_requests(run_id: str, rows: Iterable[mpb.MetricRow]
                     ) -> Iterator[mpb.ReportMetricsRequest]:
    batch = list(rows)
    for i in range(0, len(batch), MAX_METRIC_ROWS):
        yield mpb.ReportMetricsRequest(run_id=run_id, rows=batch[i:i + MAX_METRIC_ROWS])


def _merge(into: pb.PublishResponse, part: pb.PublishResponse) -> None:
    into.results.extend(part.results)
    into.stored += part.stored
    into.duplicates += part.duplicates


def _fetch_request(run_id: str, policy_id: str, consumer: str, max_records: int,
                   block_ms: int, current_round: int, max_round_lag: int,
                   min_policy_version: int, claim_idle_ms: int) -> pb.FetchRolloutsRequest:
    return pb.FetchRolloutsRequest(
        run_id=run_id, policy_id=policy_id, consumer=consumer, max_records=max_records,
        block_ms=block_ms, current_round=current_round, max_round_lag=max_round_lag,
        min_policy_version=min_policy_version, claim_idle_ms=claim_idle_ms)


class AsyncSeeClient(AsyncClient):
    """asyncio client (constructor: `mutualrl.client.base`; grpc.aio channel); `async with` or
    `await close()`. `SeeClient` is its blocking facade."""

    default_address = DEFAULT_ADDRESS
    service = "SEE"

    def __init__(self, target: Target = None, **overrides: Any) -> None:
        super().__init__(target, **overrides)
        self.stub = pb_grpc.ExperienceExchangeStub(self.channel)

    async def _rpc(self, method: str, request: Any, extra_timeout: float = 0.0,
                   timeout: float | None = None, outage_budget: float | None = None) -> Any:
        """`timeout` (seconds, each attempt) replaces the options' timeout + `extra_timeout`;
        `outage_budget` the options' budget."""
        return await self._call(getattr(self.stub, method), request,
                                self.options.timeout + extra_timeout if timeout is None
                                else timeout, outage_budget)

    async def create_run(self, run_id: str, policies: Sequence[str], tau: float = 1.0, *,
                         exist_ok: bool = False, max_stream_len: int = 0, ttl_seconds: int = 0,
                         max_rounds: int = 0) -> pb.Run:
        cfg = _run_config(run_id, policies, tau, max_stream_len, ttl_seconds, max_rounds)
        return await self._rpc("CreateRun", pb.CreateRunRequest(config=cfg, exist_ok=exist_ok))

    async def get_run(self, run_id: str) -> pb.Run:
        return await self._rpc("GetRun", pb.GetRunRequest(run_id=run_id))

    async def list_runs(self) -> list[pb.Run]:
        """Every run, in id order (all pages)."""
        runs: list[pb.Run] = []
        token = ""
        while True:
            page = await self._rpc("ListRuns", pb.ListRunsRequest(page_token=token))
            runs += page.runs
            token = page.next_page_token
            if not token:
                return runs

    async def publish(self, run_id: str, records: Iterable[pb.ExperienceRecord]
                      ) -> pb.PublishResponse:
        """Publish any number of records (split into calls of at most 4096)."""
        out = pb.PublishResponse()
        batch = list(records)
        for i in range(0, len(batch), MAX_BATCH):
            part = await self._rpc(
                "Publish", pb.PublishRequest(run_id=run_id, records=batch[i:i + MAX_BATCH]))
            _merge(out, part)
        return out

    async def publish_request(self, request: pb.PublishRequest) -> pb.PublishResponse:
        """Publish a prepared request as is (the benchmark builds requests once)."""
        return await self._rpc("Publish", request)

    async def fetch_rollouts(self, run_id: str, policy_id: str, consumer: str, *,
                             max_records: int = 256, block_ms: int = 0, current_round: int = -1,
                             max_round_lag: int = 0, min_policy_version: int = 0,
                             claim_idle_ms: int = 0, timeout: float | None = None,
                             outage_budget: float | None = None
                             ) -> pb.FetchRolloutsResponse:
        req = _fetch_request(run_id, policy_id, consumer, max_records, block_ms, current_round,
                             max_round_lag, min_policy_version, claim_idle_ms)
        return await self._rpc("FetchRollouts", req, extra_timeout=block_ms / 1000,
                               timeout=timeout, outage_budget=outage_budget)

    async def ack(self, run_id: str, policy_id: str, delivery_ids: Sequence[str], *,
                  timeout: float | None = None, outage_budget: float | None = None) -> int:
        if not delivery_ids:
            return 0
        resp = await self._rpc("Ack", pb.AckRequest(run_id=run_id, policy_id=policy_id,
                                                     delivery_ids=list(delivery_ids)),
                               timeout=timeout, outage_budget=outage_budget)
        return int(resp.acked)

    async def take_peer_rollouts(self, run_id: str, policy_id: str, consumer: str,
                                 **kwargs: Any) -> list[pb.ExperienceRecord]:
        """Fetch peer rollouts and acknowledge them at once (at-most-once for the caller), up
        to `max_records` over as many pages as SEE's byte budget needs.

        A trainer that must not lose records across its own crash should call
        `fetch_rollouts`, use the records, then `ack` their delivery ids.
        """
        most = int(kwargs.pop("max_records", 256))
        out: list[pb.ExperienceRecord] = []
        while len(out) < most:
            resp = await self.fetch_rollouts(run_id, policy_id, consumer,
                                             max_records=most - len(out), **kwargs)
            await self.ack(run_id, policy_id, [d.delivery_id for d in resp.deliveries])
            out += [d.record for d in resp.deliveries]
            if not resp.more or not resp.deliveries:
                break
            kwargs["block_ms"] = 0  # wait at most once
        return out

    async def round_stats(self, run_id: str, round_: int, prompt_ids: Sequence[str], *,
                          policy_id: str = "", expect_policies: Sequence[str] = (),
                          wait_ms: int = 0, timeout: float | None = None,
                          outage_budget: float | None = None, wait_only: bool = False
                          ) -> pb.RoundStatsResponse:
        """Pooled reward stats of `round_` for `prompt_ids` (every page, merged: `complete`
        when every page was, `missing_policies` of all pages). Each page waits up to what is
        left of `wait_ms`. `wait_only`: only wait for the round (no stats come back, nothing
        counts as taken by `policy_id`)."""
        req = pb.RoundStatsRequest(run_id=run_id, round=round_, prompt_ids=list(prompt_ids),
                                   policy_id=policy_id, expect_policies=list(expect_policies),
                                   wait_ms=wait_ms, wait_only=wait_only)
        start = time.monotonic()
        out = pb.RoundStatsResponse(complete=True)
        missing: set[str] = set()
        while True:
            req.wait_ms = max(0, wait_ms - int((time.monotonic() - start) * 1000))
            page = await self._rpc("GetRoundStats", req, extra_timeout=req.wait_ms / 1000,
                                   timeout=timeout, outage_budget=outage_budget)
            out.prompts.extend(page.prompts)
            out.complete = out.complete and page.complete
            missing.update(page.missing_policies)
            req.page_token = page.next_page_token
            if not req.page_token:
                out.missing_policies.extend(sorted(missing))
                return out

    async def successes(self, run_id: str, policy_id: str, prompt_ids: Sequence[str], *,
                        max_per_prompt: int = 0, min_round: int = 0,
                        timeout: float | None = None, outage_budget: float | None = None
                        ) -> dict[str, list[pb.ExperienceRecord]]:
        """Peer verified successes per prompt (deduplicated by normalised text)."""
        req = pb.SuccessesRequest(run_id=run_id, policy_id=policy_id, prompt_ids=list(prompt_ids),
                                  max_per_prompt=max_per_prompt, min_round=min_round)
        out: dict[str, list[pb.ExperienceRecord]] = {}
        while True:
            page = await self._rpc("GetVerifiedSuccesses", req, timeout=timeout,
                                   outage_budget=outage_budget)
            for p in page.prompts:
                out.setdefault(p.prompt_id, []).extend(p.successes)
            req.page_token = page.next_page_token
            if not req.page_token:
                return out

    async def run_stats(self, run_id: str) -> pb.RunStats:
        """The run's statistics with every transfer count (all pages)."""
        out = await self._rpc("GetRunStats", pb.RunStatsRequest(run_id=run_id))
        token = out.next_page_token
        while token:
            page = await self._rpc("GetRunStats", pb.RunStatsRequest(run_id=run_id,
                                                                     page_token=token))
            out.transfers.extend(page.transfers)
            token = page.next_page_token
        out.next_page_token = ""
        return out

    async def report_metrics(self, run_id: str, rows: Iterable[mpb.MetricRow]) -> int:
        """Report per-round metric rows (run_metrics.proto; SEE's dashboard draws them);
        returns the rows stored. Split into calls of at most 1024 rows."""
        stub = mpb_grpc.RunMetricsStub(self.channel)
        stored = 0
        for req in _metric_requests(run_id, rows):
            stored += int((await self._call(stub.ReportMetrics, req)).stored)
        return stored

    async def subscribe(self, run_id: str, kinds: Sequence[pb.RecordKind] = (),
                        after_id: str = ""
                        ) -> AsyncIterator[pb.ExperienceEvent]:
        """Live events until the caller stops iterating (the call is cancelled then; a
        blocking client's stream ends with `.cancel()`). After UNAVAILABLE (SEE restarting)
        the stream re-opens after the last event delivered, within the outage budget, so
        nothing published meanwhile is missed (before any event: from then on, as a live view
        does)."""
        after = [after_id]

        def open_call() -> Any:
            req = pb.SubscribeRequest(run_id=run_id, kinds=list(kinds), after_id=after[0])
            return self.stub.Subscribe(req, metadata=self.options.metadata())

        def seen(event: pb.ExperienceEvent) -> None:
            after[0] = event.event_id

        async for event in self._stream(open_call, seen):
            yield event


class SeeClient(Client[AsyncSeeClient], core=AsyncSeeClient,
                stub=pb_grpc.ExperienceExchangeStub):
    """Blocking client (constructor: `mutualrl.client.base`); one channel, closed by `close()`
    or the context manager. The blocking facade of `AsyncSeeClient`."""

    # runs
    create_run = blocking(AsyncSeeClient.create_run)
    get_run = blocking(AsyncSeeClient.get_run)
    list_runs = blocking(AsyncSeeClient.list_runs)
    # publish
    publish = blocking(AsyncSeeClient.publish)
    publish_request = blocking(AsyncSeeClient.publish_request)
    # reads
    fetch_rollouts = blocking(AsyncSeeClient.fetch_rollouts)
    ack = blocking(AsyncSeeClient.ack)
    take_peer_rollouts = blocking(AsyncSeeClient.take_peer_rollouts)
    round_stats = blocking(AsyncSeeClient.round_stats)
    successes = blocking(AsyncSeeClient.successes)
    run_stats = blocking(AsyncSeeClient.run_stats)
    report_metrics = blocking(AsyncSeeClient.report_metrics)
    subscribe = blocking_stream(AsyncSeeClient.subscribe)


# Re-exported for callers that only import this module.
RpcError = grpc.RpcError
