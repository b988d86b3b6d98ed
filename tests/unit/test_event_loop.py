"""`event_loop` of every service's config: which loop `mutualrl.common.event_loop.run` gives."""

from __future__ import annotations

import asyncio
import sys

import pytest
from pydantic import ValidationError

from mutualrl.common.config import ServiceConfig
from mutualrl.common.event_loop import run, running_loop_name


async def _loop_and(value: int) -> tuple[str, int]:
    await asyncio.sleep(0)
    return running_loop_name(), value


@pytest.mark.parametrize(("kind", "expected"),
                         [("auto", "uvloop"), ("uvloop", "uvloop"), ("asyncio", "asyncio")])
def test_run_uses_the_configured_loop_and_returns_the_result(kind: str, expected: str) -> None:
    assert run(_loop_and(7), kind) == (expected, 7)  # type: ignore[arg-type]


def test_without_uvloop_auto_falls_back_and_uvloop_is_a_clear_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # (import then raises ImportError)
    assert run(_loop_and(1), "auto") == ("asyncio", 1)
    with pytest.raises(RuntimeError, match="uvloop is not installed"):
        run(_loop_and(2), "uvloop")


def test_config_defaults_to_auto_and_refuses_unknown_loops() -> None:
    assert ServiceConfig().event_loop == "auto"
    with pytest.raises(ValidationError, match="event_loop"):
        ServiceConfig(event_loop="trio")  # type: ignore[arg-type]
