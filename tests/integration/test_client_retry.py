"""The SDK retries UNAVAILABLE through gRPC's retry policy, within one deadline per call (#14
item 10): a dead address costs at most the call's timeout, however many retries and backoffs
the options allow, and a service that comes up while a call is retrying answers that call."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import grpc
import pytest

from mutualrl.client.see import AsyncSeeClient, SeeClient
from mutualrl.common.channel import ClientOptions
from mutualrl.common.config import ServiceConfig
from mutualrl.common.grpc_server import start_server
from mutualrl.v1 import experience_pb2, experience_pb2_grpc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_service_config_is_grpc_retry_policy_on_unavailable() -> None:
    opts = ClientOptions(retries=3, backoff_base=0.25, backoff_max=2)
    (method,) = json.loads(opts.service_config())["methodConfig"]
    assert method["name"] == [{}]
    assert method["retryPolicy"] == {
        "maxAttempts": 4, "initialBackoff": "0.250s", "maxBackoff": "2.000s",
        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}
    assert "retryPolicy" not in json.loads(ClientOptions(retries=0).service_config())[
        "methodConfig"][0]
    with pytest.raises(ValueError, match="retries"):
        ClientOptions(retries=5)  # gRPC caps attempts at 5


def test_retries_stay_within_the_calls_deadline() -> None:
    """Nothing listens: backoffs of up to 0.5+1+2+4 s would follow each attempt in a loop
    around the call; with the policy the call ends by its 1 s deadline."""
    opts = ClientOptions(address=f"127.0.0.1:{_free_port()}", timeout=1.0, retries=4,
                         backoff_base=0.5, backoff_max=4.0)
    with SeeClient(opts) as client:
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            client.list_runs()
        elapsed = time.monotonic() - start
    assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert elapsed < 1.5, elapsed
    # The caller's own timeout replaces the options' one, retries included.
    with SeeClient(opts.model_copy(update={"timeout": 30.0})) as client:
        start = time.monotonic()
        with pytest.raises(grpc.RpcError):
            client.round_stats("r", 0, ["p"], timeout=0.5)
        assert time.monotonic() - start < 1.0


async def test_a_service_that_comes_up_answers_the_retrying_call() -> None:
    class Exchange(experience_pb2_grpc.ExperienceExchangeServicer):
        async def ListRuns(self, request, context):
            return experience_pb2.ListRunsResponse(
                runs=[experience_pb2.Run(config=experience_pb2.RunConfig(run_id="up"))])

        async def Publish(self, request, context):
            return experience_pb2.PublishResponse(stored=len(request.records))

    def add(server: grpc.aio.Server) -> None:
        experience_pb2_grpc.add_ExperienceExchangeServicer_to_server(Exchange(), server)

    port = _free_port()
    opts = ClientOptions(address=f"127.0.0.1:{port}", timeout=15.0, retries=4,
                         backoff_base=0.5, backoff_max=2.0)
    # 2 MB of records: beyond gRPC's default 256 KiB retry buffer, still retried.
    big = [experience_pb2.ExperienceRecord(record_id=f"r{i}", text="x" * 200_000)
           for i in range(10)]
    async with AsyncSeeClient(opts) as client:
        call = asyncio.ensure_future(client.list_runs())
        publish = asyncio.ensure_future(client.publish("up", big))
        await asyncio.sleep(0.15)  # the first attempts have failed: connection refused
        assert not call.done() and not publish.done()
        running = await start_server(ServiceConfig(port=port), add,
                                     ["mutualrl.v1.ExperienceExchange"])
        try:
            runs = await asyncio.wait_for(call, 15)
            published = await asyncio.wait_for(publish, 15)
        finally:
            await running.stop(0)
    assert [r.config.run_id for r in runs] == ["up"]
    assert published.stored == 10
