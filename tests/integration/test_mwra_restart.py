"""`mutualrl mwra serve` as a process: SIGKILL it, restart it, the run continues from Redis."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mutualrl.client.mwra import MwraClient
from mutualrl.common.channel import ClientOptions

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]


def _start(config: Path) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MUTUALRL_AUTH_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mutualrl.cli", "--log-level", "WARNING", "mwra", "serve",
         "--config", str(config), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.search(r"MWRA listening on \S+:(\d+)", line)
        if m:
            return proc, f"127.0.0.1:{m.group(1)}"
    proc.kill()
    raise AssertionError("mwra serve did not start")


def test_sigkilled_mwra_restarts_with_the_same_allocation(tmp_path: Path, redis_url: str,
                                                         run_id: str) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(
        "mwra:\n"
        f"  redis_url: {redis_url}\n"
        "  metrics_port: null\n"
        "  strategy: balanced\n"
        "  worker_lease_seconds: 30\n"
        "  lock_ttl_seconds: 1.0\n"
        "  tick_seconds: 0.1\n"
        "  smoothing: 1.0\n", encoding="utf-8")
    proc, addr = _start(config)
    try:
        with MwraClient(ClientOptions(address=addr, timeout=15)) as c:
            c.register_worker(run_id, "gpu-node-0", cpu_slots=16, gpu_count=4, gpu_kind="H200",
                              rollout_address="10.0.0.5:30000")
            c.register_worker(run_id, "gpu-node-1", cpu_slots=16, gpu_count=4, gpu_kind="H200")
            c.register_policy(run_id, "big", rollout_budget=64)
            c.register_policy(run_id, "small", rollout_budget=64)
            c.get_allocation(run_id, "big", 0)
            c.report_step_cost(run_id, "big", 0, 3.0, units=4)
            c.report_step_cost(run_id, "small", 0, 1.0, units=4)
            before = {p: c.get_allocation(run_id, p, 1) for p in ("big", "small")}
            old_leader = c.list_allocations(run_id).leader
        # cluster mode: 8 GPUs, costs 3:1 -> 6/2
        assert (before["big"].units, before["small"].units) == (6, 2)
        assert before["big"].epoch == 2 and before["big"].round == 1
        assert before["big"].threads == 16 + 8  # all of node 0's CPUs + half of node 1's
        # sticky placement: round 0 gave big node 0 and small node 1; big grows onto node 1
        assert [(s.worker_id, s.units) for s in before["big"].slices] == [
            ("gpu-node-0", 4), ("gpu-node-1", 2)]
        assert list(before["big"].rollout_addresses) == ["10.0.0.5:30000"]
        assert list(before["small"].worker_ids) == ["gpu-node-1"]
        assert list(before["small"].rollout_addresses) == []
        assert old_leader
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL

    proc2, addr2 = _start(config)
    try:
        with MwraClient(ClientOptions(address=addr2, timeout=15)) as c:
            t0 = time.monotonic()
            after = {p: c.get_allocation(run_id, p, 1) for p in ("big", "small")}
            # same round: served from Redis at once (the new replica need not lead for that)
            assert time.monotonic() - t0 < 2.0
            assert after == before
            table = c.list_allocations(run_id)
            assert {w.worker.worker_id for w in table.workers} == {"gpu-node-0", "gpu-node-1"}
            assert {p.policy_id: round(p.smoothed_cost, 6) for p in table.policies} == {
                "big": 12.0, "small": 4.0}
            # and it carries on: the next round is planned once the dead replica's lock lapsed
            nxt = c.get_allocation(run_id, "small", 2)
            assert nxt.round == 2 and nxt.units == 2 and nxt.epoch == 2  # hysteresis: same split
            leader = c.list_allocations(run_id).leader
            assert leader and leader != old_leader  # the restarted replica took the lock
    finally:
        proc2.send_signal(signal.SIGTERM)
        proc2.wait(timeout=15)
    assert proc2.returncode == 0
