"""THL's memory stays bounded whatever clients send. A `mutualrl thl serve` process
(port 0, registrations in the real Redis) takes many registrations of a large tokenizer, used
in turn so the cache churns, and concurrent Retokenize / AlignTrace calls of up to its per-call
text limit, byte-per-token worst cases and oversized ones among them. Its peak RSS (VmHWM from
/proc) stays under a stated bound, its tokenizer cache at its caps (count and bytes, read from
its /metrics), and every refusal is INVALID_ARGUMENT or RESOURCE_EXHAUSTED naming the field."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import shutil
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from tokenizers import Tokenizer

from mutualrl.bench.testing.process import status, stop
from mutualrl.bench.testing.thl import trained_tokenizers
from mutualrl.client.thl import AsyncThlClient
from mutualrl.common.alignment_types import TraceItem
from mutualrl.common.channel import ClientOptions

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

MiB = 1 << 20
RSS_BOUND = 640 * MiB
"""The stated bound on THL's peak resident memory under the load below (importing transformers
alone, which imports torch, takes ~330 MiB of it)."""
GROWTH_BOUND = 192 * MiB
"""The stated bound on its growth while it works on the calls, over its RSS once the
registrations are made: the in-flight budget (1 MiB of requests, 2 work threads) bounds it."""
LIMITS = {"cache_size": 16, "max_tokenizers": 24, "max_text_bytes": 128 * 1024,
          "max_request_text_bytes": 256 * 1024, "max_inflight_request_bytes": 1 * MiB,
          "work_threads": 2, "max_message_bytes": 32 * MiB}


def _big_tokenizer(target: Path, n_words: int = 30_000) -> Path:
    """A word-level tokenizer with a 30k-word vocabulary (~0.6 MB of tokenizer.json)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    rng = random.Random(5)
    words = {"[UNK]": 0}
    while len(words) < n_words:
        words.setdefault("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 12))),
                         len(words))
    tok = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    target.mkdir()
    tok.save(str(target / "tokenizer.json"))
    (target / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]"}), encoding="utf-8")
    return target


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    m = re.search(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


@pytest.fixture
def thl(tmp_path: Path, redis_url: str, run_id: str
        ) -> Iterator[tuple[int, str, int, Path, int]]:
    """(pid, address, metrics port, tokenizer root, cache byte budget) of a THL process."""
    root = tmp_path / "root"
    root.mkdir()
    paths = trained_tokenizers()
    for name in ("byte_bpe", "wordpiece"):
        shutil.copytree(paths[name], root / name)
    big = _big_tokenizer(root / "big")
    size = len(Tokenizer.from_file(str(big / "tokenizer.json")).to_str())  # as THL counts
    budget = 3 * size + size // 2  # three of the large one and the small ones
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps({"thl": {
        "port": 0, "metrics_port": 0, "redis_url": redis_url, "key_prefix": run_id,
        "tokenizer_roots": [str(root)], "cache_max_bytes": budget, **LIMITS}}),
        encoding="utf-8")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MUTUALRL_AUTH_TOKEN", None)
    log = tmp_path / "thl.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mutualrl.cli", "--log-level", "INFO", "thl", "serve",
             "--config", str(config)], stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the ready line
        m = re.search(r"THL listening on \S+:(\d+)", line)
        assert m, (line, log.read_text())
        found = re.search(r"metrics=(\d+)", log.read_text())
        assert found, log.read_text()
        yield proc.pid, f"127.0.0.1:{m.group(1)}", int(found.group(1)), root, budget
    finally:
        stop(proc)


def _texts(rng: random.Random, total: int, count: int) -> list[str]:
    """`count` texts of `total` UTF-8 bytes in all; emoji and accents make a byte-level
    tokenizer emit about one token per byte, its worst case."""
    pieces = ("🎉", "é", "日本", " the", " 42", "ß", "\n", " fox", "👍🏽", "∑")
    out = []
    for _ in range(count):
        parts: list[str] = []
        size = 0
        while size < total // count - 16:
            p = rng.choice(pieces)
            parts.append(p)
            size += len(p.encode("utf-8"))
        out.append("".join(parts))
    return out


async def test_thl_memory_stays_bounded_under_large_and_varied_requests(
        thl: tuple[int, str, int, Path, int]) -> None:
    pid, address, metrics_port, root, budget = thl

    def check_cache() -> None:
        assert _metric(metrics_port, "mutualrl_thl_tokenizer_cache_entries") <= 5
        assert 0 < _metric(metrics_port, "mutualrl_thl_tokenizer_cache_bytes") <= budget

    codes: Counter[str] = Counter()
    over: Counter[str] = Counter()  # what the calls over the per-call text limit got

    async def call(coro: object, fields: tuple[str, ...],
                   tally: Counter[str] | None = None) -> object:
        tallies = (codes,) if tally is None else (codes, tally)
        try:
            out = await coro  # type: ignore[misc]
            for t in tallies:
                t["OK"] += 1
            return out
        except grpc.aio.AioRpcError as err:
            for t in tallies:
                t[err.code().name] += 1
            assert err.code() in (grpc.StatusCode.INVALID_ARGUMENT,
                                  grpc.StatusCode.RESOURCE_EXHAUSTED), err.details()
            named = (err.details() or "").split(":")[0].split("[")[0]
            assert named in (*fields, "request"), err.details()  # "request": the budget
            return None

    opts = ClientOptions(address=address, outage_budget=0, timeout=60)
    async with AsyncThlClient(opts) as c:
        await c.register("bpe", str(root / "byte_bpe"))
        await c.register("wp", str(root / "wordpiece"))
        # Many registrations of a large tokenizer, each used in turn: the cache churns.
        registered = []
        for i in range(30):
            if await call(c.register(f"big{i}", str(root / "big"), run_id=f"r{i % 3}"),
                          ("tokenizer_id",)):
                registered.append(f"big{i}")
        assert len(registered) == LIMITS["max_tokenizers"] - 2
        for tid in registered:
            out = await c.retokenize(tid, ["the quick fox jumps"])
            assert len(out[0].token_ids) == 4
            check_cache()
        cache_bytes = _metric(metrics_port, "mutualrl_thl_tokenizer_cache_bytes")
        baseline = status(pid, "VmRSS")

        rng = random.Random(11)

        async def worker(k: int) -> None:
            for round_ in range(2):
                texts = _texts(rng, 250 * 1024, 8)  # just under the per-call limit
                src = await call(c.retokenize("bpe", texts), ("texts",))
                # Over it: refused for its size, or before its body is read while the budget
                # is full.
                await call(c.retokenize("wp", [*texts, "x" * 30_000]), ("texts",), over)
                if src is not None:
                    items = [TraceItem(t, r.token_ids, np.full(len(r.token_ids), -0.5),
                                       r.offsets)
                             for t, r in zip(texts[:4], src, strict=False)]  # type: ignore
                    await call(c.align_trace("bpe", "wp", items), ("items",))
                await call(c.retokenize(registered[(k + round_) % len(registered)],
                                        texts[:4]), ("texts",))

        await asyncio.gather(*(worker(k) for k in range(4)))
    peak = status(pid, "VmHWM")
    print(f"THL RSS: baseline {baseline / MiB:.0f} MiB, peak {peak / MiB:.0f} MiB, "
          f"now {status(pid, 'VmRSS') / MiB:.0f} MiB; cache {cache_bytes / MiB:.1f} MiB; "
          f"refusals {dict(codes)}")
    assert peak < RSS_BOUND, (peak / MiB, baseline / MiB)
    assert peak - baseline < GROWTH_BOUND, (peak / MiB, baseline / MiB)
    assert over["OK"] == 0 and over.total() == 4 * 2, over  # every call over the limit
    assert over["INVALID_ARGUMENT"] == codes["INVALID_ARGUMENT"]  # and only those
    assert codes["RESOURCE_EXHAUSTED"] >= 6 + 1  # the registrations beyond the cap, the budget
    assert codes["OK"] >= 24 + 4
    check_cache()
    assert _metric(metrics_port, "mutualrl_grpc_inflight_request_bytes") == 0


@pytest.mark.timeout(600)
def test_thl_peak_on_4_mib_of_emoji_one_call_and_three_at_once() -> None:
    """THL with its default limits on the largest inputs they let through: Retokenize of 4 MiB
    of emoji in four 1 MiB texts (3.1 M tokens), and AlignTrace of two such texts with their
    full traces (a 20 MB request, a 42 MB answer), one call and three at once, peak under the
    bound docs/reliability.md states (`mutualrl bench thl --memory` runs the same, with
    repeats). Inputs beyond the limits are refused before any work."""
    from mutualrl.bench.thl_memory import BOUND_MIB, SCENARIOS, run_memory

    out = run_memory(repeats=1, scenarios=SCENARIOS)
    print(json.dumps(out, indent=1))
    for name, figures in out["scenarios"].items():
        tokens = 4 if name.startswith("retokenize") else 2
        assert figures["tokens_per_call"] == tokens * 3 * (1 << 18), name
        assert figures["peak_mib"] < BOUND_MIB, (name, figures)
    assert {name: r["code"] for name, r in out["refusals"].items()} == {
        # past Retokenize's largest request: refused from its length, before it is read
        "texts over max_request_text_bytes (5 x 1 MiB)": "RESOURCE_EXHAUSTED",
        "one text over max_text_bytes (1 MiB + 4 B)": "INVALID_ARGUMENT",
        "1 M source tokens for a 64 kB text": "INVALID_ARGUMENT",
        "1 M source tokens, one value missing": "INVALID_ARGUMENT",
        "4 x 1 MiB of emoji, 1 M source tokens each (answer over 64 MiB)":
            "RESOURCE_EXHAUSTED"}
