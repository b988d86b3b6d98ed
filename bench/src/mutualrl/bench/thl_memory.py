"""`mutualrl bench thl --memory`: THL's peak resident memory on the largest input its default
limits let through, one call and three at once, against the bound docs/reliability.md states;
and how long THL takes to refuse inputs beyond its limits.

Each scenario runs in a fresh `mutualrl thl serve` process with THL's default limits (peak RSS,
VmHWM, is a per-process high-water mark), after one tokenizer registration and one small call:
`base` is its RSS then, `peak` its VmHWM after the scenario. The input is 4 MiB of emoji in
four 1 MiB texts: byte-level BPE makes three tokens of each (3.1 M tokens, a 27 MB answer),
the worst case per byte of text. `align` sends two of the texts to AlignTrace, from and to the
same tokenizer, with their source tokens, offsets and values (a 42 MB answer: with more, the
answer would pass the 64 MiB message limit and be refused); three such requests (21 MB each)
do not all fit THL's request budget at once (`max_inflight_request_bytes`: each call takes
AlignTrace's largest request, 64 MiB, before its body is read), so a call refused
RESOURCE_EXHAUSTED retries, as a client would. Scenarios repeat `repeats` times (a fresh process
each); the median is reported with the machine's load average.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from mutualrl.bench.testing.process import status, stop
from mutualrl.bench.testing.thl import trained_tokenizers
from mutualrl.client.thl import AsyncThlClient
from mutualrl.common import alignment_wire as wire
from mutualrl.common.alignment_types import TraceItem
from mutualrl.common.channel import ClientOptions
from mutualrl.v1 import alignment_pb2 as pb
from mutualrl.v1 import alignment_pb2_grpc as pb_grpc

MiB = 1 << 20
BOUND_MIB = 640
"""The peak docs/reliability.md states for THL with its default limits."""
TEXT = "\U0001f389" * (MiB // 4)
"""1 MiB of emoji: three byte-level BPE tokens each."""


@contextmanager
def thl_process(root: Path, **limits: Any) -> Iterator[tuple[int, str]]:
    """(pid, address) of a `mutualrl thl serve` with default limits (but `limits`), reading
    tokenizers from `root`, registrations in memory."""
    work = Path(tempfile.mkdtemp(prefix="thl-memory-"))
    config = work / "run.yaml"
    config.write_text(json.dumps({"thl": {"port": 0, "metrics_port": None,
                                          "tokenizer_roots": [str(root)], **limits}}),
                      encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "MUTUALRL_AUTH_TOKEN"}
    with (work / "thl.log").open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mutualrl.cli", "thl", "serve",
                                 "--config", str(config)], stdout=subprocess.PIPE, stderr=log,
                                text=True, env=env)
    try:
        assert proc.stdout is not None
        ready = re.search(r"THL listening on \S+:(\d+)", proc.stdout.readline())
        if ready is None:
            raise RuntimeError((work / "thl.log").read_text())
        yield proc.pid, f"127.0.0.1:{ready.group(1)}"
    finally:
        stop(proc)
        shutil.rmtree(work, ignore_errors=True)


def _client(address: str) -> AsyncThlClient:
    return AsyncThlClient(ClientOptions(address=address, outage_budget=0, timeout=600))


async def _scenario(root: Path, kind: str, at_once: int) -> dict[str, Any]:
    texts = [TEXT] * (4 if kind == "retokenize" else 2)
    with thl_process(root) as (pid, address):
        async with _client(address) as thl:
            await thl.register("bpe", str(root / "byte_bpe"))
            await thl.retokenize("bpe", ["warm up"])
            items: list[TraceItem] = []
            if kind == "align":
                # The source side is built in this process (THL would send it back anyway).
                from mutualrl.thl.engine import AlignmentEngine

                engine = AlignmentEngine()
                engine.register("bpe", str(root / "byte_bpe"))
                items = [TraceItem(t, r.token_ids, np.full(len(r.token_ids), -0.5), r.offsets)
                         for t, r in zip(texts, engine.retokenize("bpe", texts), strict=True)]
                del engine
            base = status(pid, "VmRSS")

            retries = 0

            async def one() -> int:
                nonlocal retries
                while True:
                    try:
                        if kind == "align":
                            res = await thl.align_trace("bpe", "bpe", items)
                            return sum(len(a.target_token_ids) for a in res.results)
                        return sum(len(r.token_ids) for r in await thl.retokenize("bpe", texts))
                    except grpc.aio.AioRpcError as err:
                        if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                            raise
                        retries += 1
                        await asyncio.sleep(0.5)

            start = time.perf_counter()
            tokens = await asyncio.gather(*(one() for _ in range(at_once)))
            seconds = time.perf_counter() - start
        peak = status(pid, "VmHWM")
    return {"base_mib": base / MiB, "peak_mib": peak / MiB, "growth_mib": (peak - base) / MiB,
            "seconds": seconds, "tokens_per_call": tokens[0], "retries": retries}


async def _refusals(root: Path) -> dict[str, dict[str, Any]]:
    """How long THL takes to refuse inputs beyond its limits, and with what: from sending a
    request built beforehand to its answer."""
    big = 1_000_000
    ids, zeros = np.zeros(big, dtype=np.int64), np.zeros(big)

    def align(text: str, n: int, values: int, copies: int = 1) -> pb.AlignTraceRequest:
        item = wire.item_to_pb(TraceItem(text, ids[:n], zeros[:values],
                                         np.zeros((n, 2), dtype=np.int64)))
        return pb.AlignTraceRequest(source_tokenizer_id="bpe", target_tokenizer_id="bpe",
                                    items=[item] * copies)

    cases: dict[str, tuple[str, Any]] = {
        "texts over max_request_text_bytes (5 x 1 MiB)":
            ("Retokenize", pb.RetokenizeRequest(tokenizer_id="bpe", texts=[TEXT] * 5)),
        "one text over max_text_bytes (1 MiB + 4 B)":
            ("Retokenize", pb.RetokenizeRequest(tokenizer_id="bpe",
                                                texts=[TEXT + "\U0001f389"])),
        "1 M source tokens for a 64 kB text": ("AlignTrace", align("a" * 65_536, big, big)),
        "1 M source tokens, one value missing": ("AlignTrace", align(TEXT, big, big - 1)),
        "4 x 1 MiB of emoji, 1 M source tokens each (answer over 64 MiB)":
            ("AlignTrace", align(TEXT, big, big, copies=4)),
    }
    out: dict[str, dict[str, Any]] = {}
    with thl_process(root) as (_, address):
        async with _client(address) as thl:
            await thl.register("bpe", str(root / "byte_bpe"))
            await thl.retokenize("bpe", ["warm up"])
        options = [("grpc.max_send_message_length", 256 * MiB),
                   ("grpc.max_receive_message_length", 256 * MiB)]
        async with grpc.aio.insecure_channel(address, options=options) as channel:
            stub = pb_grpc.AlignmentStub(channel)
            for name, (method, request) in cases.items():
                start = time.perf_counter()
                try:
                    await getattr(stub, method)(request, timeout=600)
                    code = "OK"
                except grpc.aio.AioRpcError as err:
                    code = err.code().name
                out[name] = {"code": code, "seconds": time.perf_counter() - start,
                             "request_mib": request.ByteSize() / MiB}
    return out


SCENARIOS = (("retokenize", 1), ("retokenize", 3), ("align", 1), ("align", 3))


def run_memory(repeats: int = 3, scenarios: tuple[tuple[str, int], ...] = SCENARIOS,
               refusals: bool = True) -> dict[str, Any]:
    """The figures of `mutualrl bench thl --memory` (see the module docstring)."""
    root = Path(tempfile.mkdtemp(prefix="thl-memory-root-"))
    shutil.copytree(trained_tokenizers()["byte_bpe"], root / "byte_bpe")
    try:
        load = os.getloadavg()
        results: dict[str, Any] = {}
        for kind, at_once in scenarios:
            runs = [asyncio.run(_scenario(root, kind, at_once)) for _ in range(max(1, repeats))]
            results[f"{kind} x{at_once}"] = {
                **{key: statistics.median(r[key] for r in runs)
                   for key in ("base_mib", "peak_mib", "growth_mib", "seconds")},
                "peak_mib_each": [round(r["peak_mib"], 1) for r in runs],
                "tokens_per_call": runs[0]["tokens_per_call"],
                "retries": sum(r["retries"] for r in runs)}
        out: dict[str, Any] = {
            "bench": "thl-memory", "input": "4 x 1 MiB of emoji (byte-level BPE, 3.1 M tokens)",
            "bound_mib": BOUND_MIB, "repeats": repeats, "scenarios": results,
            "within_bound": all(r["peak_mib"] < BOUND_MIB for r in results.values()),
            "load_average_before": load, "load_average_after": os.getloadavg()}
        if refusals:
            out["refusals"] = asyncio.run(_refusals(root))
        return out
    finally:
        shutil.rmtree(root, ignore_errors=True)
