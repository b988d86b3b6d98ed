"""The bytes a service's calls hold at once (`mutualrl.common.admission.BytesBudget`): a call
that does not fit waits in arrival order and is admitted when room comes, or is refused
RESOURCE_EXHAUSTED naming the budget when none comes within its wait; one call alone always
runs, and a call that gives up leaves no share behind."""

from __future__ import annotations

import asyncio

import pytest

from mutualrl.common.admission import BytesBudget
from mutualrl.common.errors import ResourceExhausted


async def test_a_call_waits_for_room_in_arrival_order() -> None:
    budget = BytesBudget(10, wait_seconds=5, service="SEE")
    await budget.acquire(8)
    first = asyncio.ensure_future(budget.acquire(5))
    second = asyncio.ensure_future(budget.acquire(1))  # fits, but waits its turn
    await asyncio.sleep(0.01)
    assert not first.done() and not second.done()
    budget.release(8)
    await asyncio.wait_for(asyncio.gather(first, second), 1)
    assert budget.in_use == 6 and budget.peak == 8


async def test_a_call_without_room_is_refused_naming_the_budget() -> None:
    budget = BytesBudget(10, wait_seconds=0.05, service="THL")
    await budget.acquire(8)
    with pytest.raises(ResourceExhausted) as err:
        await budget.acquire(5)
    assert "max_inflight_request_bytes" in err.value.message and "THL" in err.value.message
    assert budget.in_use == 8
    budget.release(8)
    await budget.acquire(64)  # alone: larger than the whole budget, still runs
    assert budget.in_use == 64


async def test_a_cancelled_wait_leaves_nothing_held() -> None:
    budget = BytesBudget(10, wait_seconds=5, service="MWRA")
    await budget.acquire(8)
    waiting = asyncio.ensure_future(budget.acquire(5))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    budget.release(8)
    assert budget.in_use == 0
    await asyncio.wait_for(budget.acquire(10), 1)
