"""The shared server builder: health open, everything else behind the bearer token, metrics."""

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from mutualrl.common.config import ServiceConfig
from mutualrl.common.grpc_server import GRPC_REQUESTS, start_server


async def _list_services(channel: grpc.aio.Channel, metadata: tuple = ()) -> list[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    call = stub.ServerReflectionInfo(metadata=metadata)
    await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
    await call.done_writing()
    reply = await call.read()
    return sorted(s.name for s in reply.list_services_response.service)


async def test_health_open_reflection_needs_token() -> None:
    running = await start_server(ServiceConfig(port=0, auth_token="tok"), lambda s: None,
                                 ["mutualrl.v1.Test"])
    try:
        async with grpc.aio.insecure_channel(running.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(service="mutualrl.v1.Test"))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            names = await _list_services(channel, (("authorization", "Bearer tok"),))
            assert "mutualrl.v1.Test" in names and "grpc.health.v1.Health" in names
    finally:
        await running.stop(0)


async def test_unary_call_without_token_is_unauthenticated_and_counted() -> None:
    from mutualrl.v1 import experience_pb2, experience_pb2_grpc

    class Exchange(experience_pb2_grpc.ExperienceExchangeServicer):
        async def ListRuns(self, request, context):
            return experience_pb2.ListRunsResponse()

    def add(server: grpc.aio.Server) -> None:
        experience_pb2_grpc.add_ExperienceExchangeServicer_to_server(Exchange(), server)

    running = await start_server(ServiceConfig(port=0, auth_token="tok"), add,
                                 ["mutualrl.v1.ExperienceExchange"])
    method = "/mutualrl.v1.ExperienceExchange/ListRuns"
    before = GRPC_REQUESTS.labels(method, "UNAUTHENTICATED")._value.get()
    try:
        async with grpc.aio.insecure_channel(running.address) as channel:
            stub = experience_pb2_grpc.ExperienceExchangeStub(channel)
            for metadata in [(), (("authorization", "Bearer wrong"),)]:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.ListRuns(experience_pb2.ListRunsRequest(), metadata=metadata)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            ok = await stub.ListRuns(experience_pb2.ListRunsRequest(),
                                     metadata=(("authorization", "Bearer tok"),))
            assert list(ok.runs) == []
    finally:
        await running.stop(0)
    assert GRPC_REQUESTS.labels(method, "UNAUTHENTICATED")._value.get() == before + 2


async def test_undecodable_body_is_invalid_argument_without_error_log(
        caplog: pytest.LogCaptureFixture) -> None:
    """#14 item 1: bytes that do not parse (invalid UTF-8 in a string field, a truncated varint)
    are INVALID_ARGUMENT with the token and UNAUTHENTICATED without it, never UNKNOWN, and grpc
    logs no ERROR for them, for unary and server-streaming methods alike."""
    import logging

    from mutualrl.v1 import experience_pb2, experience_pb2_grpc

    class Exchange(experience_pb2_grpc.ExperienceExchangeServicer):
        async def GetRun(self, request, context):
            return experience_pb2.Run()

        async def Subscribe(self, request, context):
            yield experience_pb2.ExperienceEvent()

    def add(server: grpc.aio.Server) -> None:
        experience_pb2_grpc.add_ExperienceExchangeServicer_to_server(Exchange(), server)

    running = await start_server(ServiceConfig(port=0, auth_token="tok"), add,
                                 ["mutualrl.v1.ExperienceExchange"])
    bad_utf8 = b"\x0a\x02\xff\xfe"  # field 1 (run_id, a string) = two bytes of invalid UTF-8
    truncated = b"\x08\xff"  # a varint that never ends
    auth = (("authorization", "Bearer tok"),)
    caplog.set_level(logging.DEBUG)
    try:
        async with grpc.aio.insecure_channel(running.address) as channel:
            for path, streaming in [("/mutualrl.v1.ExperienceExchange/GetRun", False),
                                    ("/mutualrl.v1.ExperienceExchange/Subscribe", True)]:
                call = (channel.unary_stream if streaming else channel.unary_unary)(path)
                for body in (bad_utf8, truncated):
                    for metadata, code in [(auth, grpc.StatusCode.INVALID_ARGUMENT),
                                           ((), grpc.StatusCode.UNAUTHENTICATED)]:
                        with pytest.raises(grpc.aio.AioRpcError) as err:
                            reply = call(body, metadata=metadata, timeout=5)
                            if streaming:
                                async for _ in reply:  # type: ignore[union-attr]
                                    pass
                            else:
                                await reply
                        assert err.value.code() == code, (path, body, metadata)
                        if code == grpc.StatusCode.INVALID_ARGUMENT:
                            message = path.rsplit("/", 1)[1]
                            assert (f"request: body is not a valid mutualrl.v1.{message}Request"
                                    in (err.value.details() or ""))
            ok = await channel.unary_unary("/mutualrl.v1.ExperienceExchange/GetRun")(
                b"", metadata=auth, timeout=5)
            assert ok == b""
    finally:
        await running.stop(0)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []
