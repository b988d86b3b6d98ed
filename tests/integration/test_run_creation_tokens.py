"""Who creates a run when trainers hold policy tokens (#14 item 13): `mutualrl create-run` with
the run's secret does; a trainer's `PeerExchange.join` with its policy token waits for the run
and checks it lists the policy, and may not create it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from mutualrl.bench.testing.see import make_config, running_see
from mutualrl.client.see import AsyncSeeClient
from mutualrl.common.auth import derive_token
from mutualrl.common.channel import ClientOptions
from mutualrl.trainer.sharing.exchange import PeerExchange

pytestmark = pytest.mark.timeout(120)

SECRET = "create-secret-91b"
POLICIES = ["gpt2-bpe", "llama-char"]


def _create_run(config: Path, see: str, token: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MUTUALRL_AUTH_TOKEN": token, "MUTUALRL_SEE_ADDR": see}
    return subprocess.run([sys.executable, "-m", "mutualrl.cli", "create-run", "-c", str(config)],
                          capture_output=True, text=True, env=env, timeout=60)


def _join(see: str, run_id: str, policy: str, wait_s: float) -> float:
    """Seconds a trainer of `policy` holding its policy token took to join."""
    ex = PeerExchange(run_id, policy, f"{run_id}/{policy}", see, None, None,
                      token=derive_token(SECRET, f"policy:{policy}"), timeout=10)
    t0 = time.monotonic()
    try:
        ex.join(POLICIES, {}, run_wait_s=wait_s)
    finally:
        ex.close()
    return time.monotonic() - t0


async def test_policy_token_trainer_waits_for_the_run_the_secret_creates(
        redis_url: str, run_id: str, tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"trainer": {
        "run_id": run_id, "probe": {"tau": 0.75},
        "policies": [{"name": n, "preset": n} for n in POLICIES]}}))
    async with running_see(make_config(redis_url, auth_token=SECRET)) as srv:
        see: Any = srv.address
        # No run yet: a trainer that will not wait is told who must create it.
        with pytest.raises(RuntimeError, match="create the run with the run's secret"):
            await asyncio.to_thread(_join, see, run_id, "gpt2-bpe", 0.0)
        # A policy token may not create the run through the command either.
        denied = await asyncio.to_thread(_create_run, config, see,
                                         derive_token(SECRET, "policy:gpt2-bpe"))
        assert denied.returncode == 1
        assert "PERMISSION_DENIED" in denied.stderr, denied.stderr
        # A trainer waiting for its run joins once the secret's holder created it.
        waiting = asyncio.create_task(asyncio.to_thread(_join, see, run_id, "gpt2-bpe", 30.0))
        await asyncio.sleep(1.5)
        assert not waiting.done()
        made = await asyncio.to_thread(_create_run, config, see, SECRET)
        assert made.returncode == 0, made.stderr
        assert await waiting >= 1.5
        again = await asyncio.to_thread(_create_run, config, see, SECRET)  # idempotent
        assert again.returncode == 0, again.stderr
        async with AsyncSeeClient(ClientOptions(address=see, token=SECRET)) as admin:
            run = await admin.get_run(run_id)
        assert list(run.config.policies) == POLICIES and run.config.tau == 0.75
        # A policy the run does not list is refused with the run's policies named.
        with pytest.raises(RuntimeError, match="does not list policy 'qwen2-unigram'"):
            await asyncio.to_thread(_join, see, run_id, "qwen2-unigram", 0.0)
