"""Trainers' round metrics beyond metrics.jsonl: to SEE in the background (live dashboard), and to
Weights & Biases in offline mode (no network)."""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from mutualrl.bench.testing.see import make_config, running_see
from mutualrl.client.see import AsyncSeeClient, ClientOptions
from mutualrl.trainer.config.run import MetricsSettings, WandbSettings
from mutualrl.trainer.runtime.live_metrics import SeeMetricsReporter
from mutualrl.trainer.runtime.metrics import MetricsSink

QUIET = dict(tensorboard=False, progress=False)


async def _rows(rest: str, run_id: str) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=rest) as h:
        return list((await h.get(f"/v1/runs/{run_id}/metrics")).json()["rows"])


async def _wait_rows(rest: str, run_id: str, n: int, timeout: float = 30.0) -> list[dict]:
    import asyncio

    deadline = time.monotonic() + timeout
    while True:
        rows = await _rows(rest, run_id)
        if len(rows) >= n or time.monotonic() > deadline:
            return rows
        await asyncio.sleep(0.1)


async def test_sink_reports_every_round_to_see(redis_url: str, run_id: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    monkeypatch.delenv("MUTUALRL_AUTH_TOKEN", raising=False)
    async with running_see(make_config(redis_url)) as see:
        async with AsyncSeeClient(ClientOptions(address=see.address)) as c:
            await c.create_run(run_id, ["pol"])
        reporter = SeeMetricsReporter(see.address, run_id, "pol")
        sink = MetricsSink(tmp_path, "pol", MetricsSettings(**QUIET), reporter, run_id)
        for k in range(3):
            sink.log(k, {"reward_mean": k / 4, "heldout/add": 0.5, "bad": float("nan")})
        await asyncio.to_thread(sink.close)  # flushes what is queued
        rows = await _rows(see.rest_url, run_id)
    assert [(r["policy_id"], r["round"], r["values"]) for r in rows] == [
        ("pol", k, {"reward_mean": k / 4, "heldout/add": 0.5}) for k in range(3)]
    assert reporter.sent == 3 and reporter.dropped == 0


async def test_a_missing_see_holds_no_round_and_gets_the_rows_later(
        redis_url: str, run_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    monkeypatch.delenv("MUTUALRL_AUTH_TOKEN", raising=False)
    async with running_see(make_config(redis_url)) as see:
        port = see.grpc.port
        async with AsyncSeeClient(ClientOptions(address=see.address)) as c:
            await c.create_run(run_id, ["pol"])
    # SEE is gone: reporting only queues (a round never waits on it).
    reporter = SeeMetricsReporter(f"127.0.0.1:{port}", run_id, "pol", retry_s=0.2)
    try:
        start = time.perf_counter()
        for k in range(5):
            reporter.report(k, {"reward_mean": float(k)})
        assert time.perf_counter() - start < 0.1
        deadline = time.monotonic() + 30
        while reporter.failures == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert reporter.failures >= 1 and reporter.sent == 0
        # SEE comes back on the same port: the queued rows arrive, in order, once each.
        async with running_see(make_config(redis_url, port=port)) as back:
            rows = await _wait_rows(back.rest_url, run_id, 5)
            assert [(r["round"], r["values"]["reward_mean"]) for r in rows] == \
                [(k, float(k)) for k in range(5)]
            await asyncio.to_thread(reporter.close)
    finally:
        reporter.close(timeout=0.1)


def _wandb_records(path: Path) -> list[Any]:
    """Records of a W&B transaction log (.wandb): a 7-byte header, then LevelDB-log framed
    protobuf `Record`s in 32 KiB blocks (checksum u32, length u16, type u8)."""
    from wandb.proto import wandb_internal_pb2 as wpb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    out, pos, pending = [], 7, b""
    block = 32 * 1024
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # the rest of a block too small for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            rec = wpb.Record()
            rec.ParseFromString(pending)
            out.append(rec)
            pending = b""
        elif kind == 0 and length == 0:
            break
    return out


def _finished_wandb_records(path: Path, timeout: float = 30.0) -> list[Any]:
    """The log's records once it holds the run's exit record: `finish()` can return before
    wandb's service process has written the transaction log (seen as a bare 7-byte header,
    complete a fraction of a second later)."""
    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + timeout
    while True:
        try:
            records = _wandb_records(path)
        except DecodeError:  # read while a record was half written
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        assert time.monotonic() < deadline, f"{path}: no exit record after {timeout} s"
        time.sleep(0.1)


def test_wandb_offline_logs_every_round_and_resumes_the_same_run(tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    import json

    settings = MetricsSettings(**QUIET, wandb=WandbSettings(project="mutualrl-test",
                                                            mode="offline", tags=["ci"]))
    sink = MetricsSink(tmp_path, "gpt2-bpe", settings, run_id="run-7",
                       run_config={"grpo": {"lr": 3e-4}})
    for k in range(3):
        sink.log(k, {"reward_mean": 0.25 * k, "heldout/add": 0.5})
    sink.close()
    run_key = (tmp_path / "wandb_id").read_text()
    logs = list(tmp_path.glob(f"wandb/offline-run-*-{run_key}/run-{run_key}.wandb"))
    assert len(logs) == 1
    records = _finished_wandb_records(logs[0])
    history = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                     for i in r.history.item}
            history.append(items)
        if r.WhichOneof("record_type") == "run":
            run = r.run
    assert [(h["_step"], h["reward_mean"], h["heldout/add"]) for h in history] == \
        [(k, 0.25 * k, 0.5) for k in range(3)]
    assert (run.project, run.run_group, run.display_name, run.run_id) == \
        ("mutualrl-test", "run-7", "gpt2-bpe", run_key)
    assert list(run.tags) == ["ci"]
    # A resumed trainer (same run directory) continues the same W&B run. wandb names an offline
    # run's directory by its start second: start the resumed one in the next second.
    time.sleep(1.05 - time.time() % 1)
    again = MetricsSink(tmp_path, "gpt2-bpe", settings, run_id="run-7")
    again.log(3, {"reward_mean": 1.0})
    again.close()
    assert (tmp_path / "wandb_id").read_text() == run_key
    assert len(list(tmp_path.glob(f"wandb/offline-run-*-{run_key}"))) == 2
