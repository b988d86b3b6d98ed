"""No byte is parsed before it is trusted: a `mutualrl see serve` process with the run's secret
refuses a call without a valid token, or with a token whose scope the method's metadata already
rules out (a policy's token whose metadata names another policy, or none, for a method that
acts for a policy), before the call's body is read. Its parse counter
(`mutualrl_grpc_request_bodies` on /metrics) does not move and its peak resident memory (VmHWM,
reset before the calls) grows by less than `REFUSED_GROWTH` for three 60 MiB calls. A policy's
call whose metadata names its own policy but whose rows are another's is read, then refused
from the rows' policies, unparsed. And calls admitted hold the service's bytes budget together:
with room for eight maximal requests, a ninth waits and is then refused RESOURCE_EXHAUSTED
naming the budget, while the eight are answered.

Memory figures are the service process's own (/proc/<pid>/status), so other processes on the
machine do not move them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from mutualrl.bench.attacks import (
    ROUND_STATS,
    SECRET,
    SEE_METRICS,
    Service,
    metrics_request,
    padded,
    raw_answer,
    raw_call,
    serving,
)
from mutualrl.bench.testing.process import reset_peak, status
from mutualrl.bench.testing.see import TEST_PREFIX
from mutualrl.common.auth import POLICY_HEADER, derive_token
from mutualrl.v1 import experience_pb2 as pb

MiB = 1 << 20
REFUSED_GROWTH = 16 * MiB
"""The most three refused 60 MiB calls may grow SEE's peak resident memory by."""
CREATE_RUN = "/mutualrl.v1.ExperienceExchange/CreateRun"


@pytest.fixture(scope="module")
def see(redis_url: str) -> Iterator[Service]:
    with serving("see", {"rest_port": None, "redis_url": redis_url,
                         "key_prefix": TEST_PREFIX}) as service:
        yield service


async def _refused_unread(see: Service, method: str, token: str | None, code: str,
                          acts_for: str | None = None) -> None:
    body = b"\x0a" + b"\xff" * (60 * MiB)  # never parsed: what it holds does not matter
    await asyncio.sleep(0.2)
    read, parsed = see.read(), see.parsed()
    base = status(see.pid, "VmRSS")
    reset_peak(see.pid)
    for _ in range(3):
        assert await raw_call(see.address, method, body, token, acts_for=acts_for)() == code
    growth = status(see.pid, "VmHWM") - base
    assert see.read() == read and see.parsed() == parsed
    assert growth < REFUSED_GROWTH, f"peak grew by {growth / MiB:.1f} MiB"


async def test_an_unauthenticated_60_mib_call_is_refused_unread(see: Service) -> None:
    await _refused_unread(see, SEE_METRICS, None, "UNAUTHENTICATED")
    await _refused_unread(see, SEE_METRICS, "policy.a.00", "UNAUTHENTICATED")


async def test_a_foreign_scope_60_mib_call_is_refused_unread(see: Service) -> None:
    """The read token may not report metrics; a policy's token may not create runs."""
    await _refused_unread(see, SEE_METRICS, derive_token(SECRET, "read"), "PERMISSION_DENIED")
    await _refused_unread(see, CREATE_RUN, derive_token(SECRET, "policy:a"),
                          "PERMISSION_DENIED")


async def test_a_call_for_another_policy_is_refused_unread(see: Service) -> None:
    """Policy b's token reporting metrics for policy a: its metadata names a, or no policy."""
    b = derive_token(SECRET, "policy:b")
    await _refused_unread(see, SEE_METRICS, b, "PERMISSION_DENIED", acts_for="a")
    await _refused_unread(see, SEE_METRICS, b, "PERMISSION_DENIED", acts_for="")
    code, details = await raw_answer(see.address, SEE_METRICS, b"", b, acts_for="a")
    assert code == "PERMISSION_DENIED" and POLICY_HEADER in details and "'a'" in details
    code, details = await raw_answer(see.address, SEE_METRICS, b"", b, acts_for="")
    assert code == "PERMISSION_DENIED" and POLICY_HEADER in details, details


async def test_a_call_whose_metadata_lies_is_refused_once_read(see: Service) -> None:
    """Policy b's token, its metadata naming b, reporting rows of policy a: read (it is within
    what b may send) and refused from the rows' policies, never parsed."""
    body = metrics_request("no-run", "a", 4 * MiB)
    read, parsed = see.read(), see.parsed()
    code, details = await raw_answer(see.address, SEE_METRICS, body,
                                     derive_token(SECRET, "policy:b"), acts_for="b")
    assert code == "PERMISSION_DENIED" and "'a'" in details, details
    assert see.read() == read + 1 and see.parsed() == parsed


async def test_the_ninth_concurrent_maximal_call_waits_then_is_refused(redis_url: str,
                                                                       run_id: str) -> None:
    """Eight GetRoundStats of the method's largest request (1 MiB), each waiting for a peer
    that never reports, hold the whole 8 MiB budget; the ninth waits `request_wait_seconds`
    and is RESOURCE_EXHAUSTED naming the budget, the eight are answered."""
    section = {"rest_port": None, "redis_url": redis_url, "key_prefix": TEST_PREFIX,
               "max_request_bytes": MiB, "max_inflight_request_bytes": 8 * MiB,
               "request_wait_seconds": 0.5}
    with serving("see", section) as see:
        create = pb.CreateRunRequest(config=pb.RunConfig(run_id=run_id, policies=["a", "b"]))
        assert await raw_call(see.address, CREATE_RUN, create.SerializeToString(),
                              SECRET)() == "OK"
        waiting = pb.RoundStatsRequest(run_id=run_id, round=0, prompt_ids=["p"],
                                       policy_id="a", expect_policies=["b"], wait_ms=6000)
        body = padded(waiting.SerializeToString(), MiB)
        token = derive_token(SECRET, "policy:a")
        held = [asyncio.ensure_future(raw_call(see.address, ROUND_STATS, body, token)())
                for _ in range(8)]
        gauge = "mutualrl_grpc_inflight_request_bytes"
        for _ in range(500):
            if see.metric(gauge) >= 8 * MiB:
                break
            await asyncio.sleep(0.01)
        assert see.metric(gauge) == 8 * MiB
        code, details = await raw_answer(see.address, ROUND_STATS, body, token)
        assert code == "RESOURCE_EXHAUSTED", details
        assert "max_inflight_request_bytes" in details and str(8 * MiB) in details
        assert not any(h.done() for h in held)
        assert await asyncio.gather(*held) == ["OK"] * 8
        for _ in range(100):
            if see.metric(gauge) == 0:
                break
            await asyncio.sleep(0.01)
        assert see.metric(gauge) == 0
        assert await raw_call(see.address, ROUND_STATS, body, token)() == "OK"
