"""The one mapping of Redis failures onto service errors (mutualrl.common.redis_errors)."""

from __future__ import annotations

import grpc
import pytest
from redis import exceptions as rexc

from mutualrl.common.errors import ResourceExhausted, Unavailable
from mutualrl.common.redis_errors import redis_errors, redis_op, service_error


@pytest.mark.parametrize(("err", "code"), [
    (rexc.ConnectionError("refused"), grpc.StatusCode.UNAVAILABLE),
    (rexc.TimeoutError("slow"), grpc.StatusCode.UNAVAILABLE),
    (rexc.BusyLoadingError("LOADING"), grpc.StatusCode.UNAVAILABLE),
    (rexc.ReadOnlyError("READONLY"), grpc.StatusCode.UNAVAILABLE),
    (rexc.ClusterDownError("CLUSTERDOWN"), grpc.StatusCode.UNAVAILABLE),
    (rexc.TryAgainError("TRYAGAIN"), grpc.StatusCode.UNAVAILABLE),
    (ConnectionResetError("reset"), grpc.StatusCode.UNAVAILABLE),
    (rexc.OutOfMemoryError("OOM"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (rexc.ResponseError("WRONGTYPE"), None),
    (rexc.NoScriptError("NOSCRIPT"), None),
])
def test_mapping(err: BaseException, code: grpc.StatusCode | None) -> None:
    mapped = service_error(err, "publish")
    assert (mapped.code if mapped is not None else None) == code
    if mapped is not None:
        assert "publish" in mapped.message and "redis" in mapped.message


async def test_redis_op_maps_reports_and_reraises_bugs() -> None:
    seen: list[tuple[str, str]] = []
    times: list[str] = []

    class Metrics:
        def failed(self, op: str, error: BaseException) -> None:
            seen.append((op, type(error).__name__))

        def timed(self, op: str, seconds: float) -> None:
            assert seconds >= 0
            times.append(op)

    with pytest.raises(Unavailable) as unavailable:
        async with redis_op("get_run", Metrics()):
            raise rexc.ConnectionError("down")
    assert isinstance(unavailable.value.__cause__, rexc.ConnectionError)
    with pytest.raises(ResourceExhausted):
        async with redis_op("publish", Metrics()):
            raise rexc.OutOfMemoryError("OOM command not allowed")
    with pytest.raises(rexc.ResponseError):  # a bug stays itself (INTERNAL, logged)
        async with redis_op("ack", Metrics()):
            raise rexc.ResponseError("ERR wrong number of arguments")
    async with redis_op("ok", Metrics()):
        pass
    assert seen == [("get_run", "ConnectionError"), ("publish", "OutOfMemoryError"),
                    ("ack", "ResponseError")]
    assert times == ["get_run", "publish", "ack", "ok"]


async def test_decorator_covers_coroutines_and_streams() -> None:
    @redis_errors
    async def unary() -> int:
        raise rexc.TimeoutError("t")

    @redis_errors
    async def stream():  # type: ignore[no-untyped-def]
        yield 1
        raise rexc.ConnectionError("c")

    with pytest.raises(Unavailable):
        await unary()
    got = []
    with pytest.raises(Unavailable):
        async for item in stream():
            got.append(item)
    assert got == [1]
