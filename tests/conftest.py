"""Shared fixtures: the real Redis on 127.0.0.1:6379 (unique run ids, cleaned after)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from service_loop import delete_keys

REDIS_URL = os.environ.get("MUTUALRL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the real Redis the integration tests use (fails loudly if it does not answer)."""
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as err:  # pragma: no cover - CI starts Redis first
        pytest.fail(f"Redis at {REDIS_URL} does not answer ({err}); start redis-server")
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture
def run_id(redis_url: str) -> Iterator[str]:
    """A run id no other test uses; every Redis key that contains it is deleted afterwards."""
    rid = f"t{uuid.uuid4().hex[:12]}"
    yield rid
    delete_keys(redis_url, f"*{rid}*")
