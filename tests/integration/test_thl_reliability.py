"""THL under odd and hostile input, over real gRPC (port 0) with registrations in the real Redis:
registration confined to `tokenizer_roots` with one answer whatever lies outside them, the
files a load opens checked too (a tokenizer.json or a directory linked out of the roots, a FIFO:
refused, also when planted after the registration), odd paths refused as INVALID_ARGUMENT,
Retokenize and AlignTrace batches too large to answer refused before the work, and
BERT-family tokenizers whose tokenizer.json truncates and pads encoded whole."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from tokenizers import Tokenizer

from mutualrl.bench.testing.thl import trained_tokenizers
from mutualrl.client.thl import AsyncThlClient
from mutualrl.common.alignment_types import TraceItem
from mutualrl.common.channel import ClientOptions
from mutualrl.common.errors import quote
from mutualrl.thl.config import ThlConfig
from mutualrl.thl.server import ThlServer, start_thl
from mutualrl.v1 import alignment_pb2 as pb

pytestmark = pytest.mark.timeout(120)
INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def paths() -> dict[str, str]:
    return trained_tokenizers()


@pytest.fixture
def root(tmp_path: Path, paths: dict[str, str]) -> Path:
    """The only directory THL may read from, holding a copy of two trained tokenizers."""
    base = tmp_path / "root"
    base.mkdir()
    for name in ("byte_bpe", "wordpiece"):
        shutil.copytree(paths[name], base / name)
    return base


async def _start(redis_url: str, run_id: str, roots: list[Path], **kw: object) -> ThlServer:
    return await start_thl(ThlConfig.model_validate({
        "port": 0, "metrics_port": None, "redis_url": redis_url, "key_prefix": run_id,
        "tokenizer_roots": [str(r) for r in roots], **kw}))


@pytest.fixture
async def server(redis_url: str, run_id: str, root: Path) -> AsyncIterator[ThlServer]:
    srv = await _start(redis_url, run_id, [root])
    yield srv
    await srv.stop(0)


def _client(srv: ThlServer) -> AsyncThlClient:
    return AsyncThlClient(ClientOptions(address=srv.address, outage_budget=0, timeout=60))


async def _error(call: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    return err.value


async def test_odd_paths_are_invalid_argument_naming_the_path(server: ThlServer,
                                                              root: Path) -> None:
    odd = {
        "a 300-character name": str(root / ("x" * 300)),
        "a NUL byte": str(root / "byte_bpe") + "\x00/tokenizer.json",
        "a NUL byte outside the roots": "/etc/passwd\x00",
        "a 5000-character path": str(root) + "/a" * 2500,
        "a 300-character name outside the roots": "/" + "y" * 300,
    }
    async with _client(server) as thl:
        for what, path in odd.items():
            err = await _error(thl.register("odd", path))
            assert err.code() == INVALID, (what, err.code(), err.details())
            assert (err.details() or "").startswith("path:"), (what, err.details())
        # still serving, and nothing was registered
        assert [i.tokenizer_id for i in await thl.list()] == []
        info = await thl.register("ok", str(root / "byte_bpe"))
        assert info.model_type == "BPE" and info.path == str((root / "byte_bpe").resolve())


async def test_paths_outside_the_roots_get_one_answer_whatever_exists_there(
        server: ThlServer, root: Path, tmp_path: Path, paths: dict[str, str]) -> None:
    (root / "escape").symlink_to(paths["char"])  # a link inside the root to a real tokenizer
    (root / "passwd").symlink_to("/etc/passwd")
    outside = {
        "a system file": "/etc/passwd",
        "a directory": "/etc",
        "nothing": "/etc/no-such-file-here",
        "a real tokenizer": paths["char"],
        "a real tokenizer.json": str(Path(paths["char"]) / "tokenizer.json"),
        "a dot-dot escape": str(root / ".." / ".." / "etc" / "passwd"),
        "a link out of the root": str(root / "escape"),
        "a link to a system file": str(root / "passwd"),
        "a relative path": "etc/passwd",
    }
    answers = {}
    async with _client(server) as thl:
        for what, path in outside.items():
            err = await _error(thl.register("x", path))
            assert err.code() == INVALID, (what, err.details())
            # the path is echoed; everything else is the same for every case
            answers[what] = (err.details() or "").replace(quote(path), "<path>")
        assert len(set(answers.values())) == 1, answers
        assert "tokenizer_roots" in next(iter(answers.values()))
        # inside the root the answers are as helpful as before
        err = await _error(thl.register("x", str(root / "missing")))
        assert err.code() == INVALID and "does not exist" in (err.details() or "")
        assert [i.tokenizer_id for i in await thl.list()] == []


async def test_links_planted_out_of_a_root_are_refused_file_and_directory(
        server: ThlServer, root: Path, tmp_path: Path, paths: dict[str, str]) -> None:
    """A directory inside a root whose tokenizer.json links out of the roots (to a real
    tokenizer, or to /etc/passwd), a linked directory inside a tokenizer directory, a FIFO: each
    register is refused before anything opens the file; the same holds at a reload, for a link
    planted after the registration succeeded."""
    outside = tmp_path / "outside"
    shutil.copytree(paths["char"], outside)
    planted = {
        "tokenizer.json -> a tokenizer outside": ("file", outside / "tokenizer.json"),
        "tokenizer.json -> /etc/passwd": ("file", Path("/etc/passwd")),
        "tokenizer_config.json -> outside": ("config", outside / "tokenizer_config.json"),
        "a directory linked out": ("dir", outside),
    }
    async with _client(server) as thl:
        for i, (what, (kind, target)) in enumerate(planted.items()):
            d = root / f"planted{i}"
            shutil.copytree(paths["byte_bpe"], d)
            if kind == "dir":
                (d / "sub").symlink_to(target, target_is_directory=True)
            else:
                name = "tokenizer.json" if kind == "file" else "tokenizer_config.json"
                (d / name).unlink()
                (d / name).symlink_to(target)
            err = await _error(thl.register(f"p{i}", str(d)))
            assert err.code() == INVALID, (what, err.details())
            assert "resolves outside the directories THL may read" in (err.details() or ""), \
                (what, err.details())
        # A FIFO (reading it would block a thread forever) is refused, as a file and inside a
        # directory.
        fifo_dir = root / "fifo"
        shutil.copytree(paths["byte_bpe"], fifo_dir)
        (fifo_dir / "special_tokens_map.json").unlink(missing_ok=True)
        os.mkfifo(fifo_dir / "special_tokens_map.json")
        os.mkfifo(root / "pipe.json")
        for path in (fifo_dir, root / "pipe.json"):
            err = await _error(thl.register("fifo", str(path)))
            assert err.code() == INVALID and "not a regular file" in (err.details() or ""), \
                err.details()
        # Planted after the registration: the reload after a cache miss refuses it.
        good = root / "good"
        shutil.copytree(paths["byte_bpe"], good)
        await thl.register("good", str(good))
        assert (await thl.retokenize("good", ["abc"]))[0].token_ids.size > 0
        server.engine.registry._forget("good")  # as if the cache had dropped it
        (good / "tokenizer.json").unlink()
        (good / "tokenizer.json").symlink_to(outside / "tokenizer.json")
        err = await _error(thl.retokenize("good", ["abc"]))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
        assert "can no longer be loaded" in (err.details() or "")
        assert "resolves outside" in (err.details() or ""), err.details()
        assert sorted(i.tokenizer_id for i in await thl.list()) == ["good"]


async def test_start_up_tokenizers_are_the_operators_and_not_confined(
        redis_url: str, run_id: str, root: Path, paths: dict[str, str]) -> None:
    srv = await _start(redis_url, run_id, [root], tokenizers={"char": paths["char"]})
    try:
        async with _client(srv) as thl:
            assert [i.tokenizer_id for i in await thl.list()] == ["char"]
            out = await thl.retokenize("char", ["abc"])
            assert out[0].token_ids.shape == (3,)
    finally:
        await srv.stop(0)


async def test_retokenize_too_large_to_answer_is_refused_up_front(
        redis_url: str, run_id: str, root: Path) -> None:
    limit = 4 << 20
    srv = await _start(redis_url, run_id, [root], max_message_bytes=limit,
                       max_text_bytes=1 << 20, tokenizers={"bpe": str(root / "byte_bpe")})
    try:
        async with _client(srv) as thl:
            text = "the quick brown fox jumps over 42 lazy dogs. " * 9000  # 405 kB
            err = await _error(thl.retokenize("bpe", [text] * 8))  # 3.2 MB: the request fits
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
            assert (err.details() or "").startswith("texts:"), err.details()
            assert f"{limit}-byte message limit" in (err.details() or "")
            # a batch whose worst case fits is answered
            out = await thl.retokenize("bpe", [text[:20000]] * 8)
            assert [len(r.text) for r in out] == [20000] * 8
    finally:
        await srv.stop(0)


async def test_align_trace_too_large_to_answer_is_refused_up_front(
        redis_url: str, run_id: str, root: Path) -> None:
    limit = 4 << 20
    srv = await _start(redis_url, run_id, [root], max_message_bytes=limit,
                       tokenizers={"bpe": str(root / "byte_bpe"), "wp": str(root / "wordpiece")})
    try:
        async with _client(srv) as thl:
            text = "the quick brown fox jumps over 42 lazy dogs. " * 4000  # 180 kB
            items = [TraceItem(text, [], []) for _ in range(6)]  # 1.1 MB: the request fits
            loads = srv.engine.registry.loads
            err = await _error(thl.align_trace("bpe", "wp", items))
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
            assert (err.details() or "").startswith("items:"), err.details()
            assert f"{limit}-byte message limit" in (err.details() or "")
            assert srv.engine.registry.loads == loads
            small = text[:20000]
            src = (await thl.retokenize("bpe", [small]))[0]
            item = TraceItem(small, src.token_ids, np.full(len(src.token_ids), -0.25))
            res = await thl.align_trace("bpe", "wp", [item] * 4)
            assert [r.chunks.char_end[-1] for r in res.results] == [20000] * 4
    finally:
        await srv.stop(0)


def _truncating_padding_bert(source_dir: str, target: Path) -> Path:
    """A WordPiece checkpoint whose tokenizer.json truncates at 128 and pads to 128, as BERT
    checkpoints ship."""
    shutil.copytree(source_dir, target)
    spec = json.loads((target / "tokenizer.json").read_text(encoding="utf-8"))
    spec["truncation"] = {"direction": "Right", "max_length": 128, "strategy": "LongestFirst",
                          "stride": 0}
    spec["padding"] = {"strategy": {"Fixed": 128}, "direction": "Right",
                       "pad_to_multiple_of": None, "pad_id": 0, "pad_type_id": 0,
                       "pad_token": "<pad>"}
    (target / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    return target


async def test_bert_tokenizer_that_truncates_and_pads_is_encoded_whole(
        server: ThlServer, root: Path, paths: dict[str, str]) -> None:
    bert = _truncating_padding_bert(paths["wordpiece"], root / "bert")
    shipped = Tokenizer.from_file(str(bert / "tokenizer.json"))
    assert shipped.truncation is not None and shipped.padding is not None
    assert len(shipped.encode("hi").ids) == 128  # what the checkpoint does by itself
    plain = Tokenizer.from_file(str(bert / "tokenizer.json"))
    plain.no_truncation()
    plain.no_padding()
    texts = ["the quick fox jumps over 12 lazy dogs, " * 20, "hi", ""]
    expected = [plain.encode(t, add_special_tokens=False) for t in texts]
    assert len(expected[0].ids) > 128 and len(expected[1].ids) < 128 and expected[2].ids == []
    async with _client(server) as thl:
        await thl.register("bert", str(bert))
        await thl.register("bpe", str(root / "byte_bpe"))
        out = await thl.retokenize("bert", texts)
        for r, e in zip(out, expected, strict=True):
            assert r.token_ids.tolist() == e.ids
            assert r.offsets.tolist() == [list(o) for o in e.offsets]
        assert out[0].residual.uncovered_bytes == 0
        # as the source of a trace: ids without offsets must be its own (whole) encoding
        items = [TraceItem(t, e.ids, np.linspace(-1.0, 0.0, len(e.ids)).tolist())
                 for t, e in zip(texts, expected, strict=True)]
        res = await thl.align_trace("bert", "bpe", items)
        for item, aligned in zip(items, res.results, strict=True):
            assert float(np.sum(aligned.chunks.value)) == pytest.approx(sum(item.values))
            assert aligned.mass_error == 0.0
        assert res.results[2].target_token_ids.tolist() == []
        # an empty text with explicitly empty offsets, in either direction
        empty = TraceItem("", [], [], np.zeros((0, 2), dtype=np.int64))
        for src, tgt in (("bert", "bpe"), ("bpe", "bert")):
            res = await thl.align_trace(src, tgt, [empty])
            assert res.results[0].target_token_ids.tolist() == []
            assert len(res.results[0].chunks) == 1


async def test_a_root_that_is_a_symlink_is_named_either_way(
        redis_url: str, run_id: str, root: Path, tmp_path: Path) -> None:
    link = tmp_path / "volume-link"
    link.symlink_to(root)  # /data/run -> the volume, as a deployment may mount it
    srv = await _start(redis_url, run_id, [link])
    try:
        async with _client(srv) as thl:
            via_link = await thl.register("a", str(link / "byte_bpe"))
            direct = await thl.register("b", str(root / "wordpiece"))
            assert via_link.path == str((root / "byte_bpe").resolve())
            assert direct.path == str((root / "wordpiece").resolve())
            err = await _error(thl.register("c", str(link / ".." / "elsewhere")))
            assert err.code() == INVALID and "tokenizer_roots" in (err.details() or "")
    finally:
        await srv.stop(0)


def test_error_names_the_configured_roots_only_by_their_setting() -> None:
    # The roots are the operator's business: the refusal names the setting, not directories.
    from mutualrl.common.errors import InvalidArgument
    from mutualrl.thl.registry import confine

    with pytest.raises(InvalidArgument) as err:
        confine("/etc/passwd", [Path("/srv/tokenizers")])
    assert "/srv" not in str(err.value) and re.search(r"thl\.tokenizer_roots", str(err.value))


async def test_a_dropped_tokenizer_leaves_no_metric_series(server: ThlServer, root: Path) -> None:
    """Series were labelled by tokenizer id and kept forever: ids come and go with runs."""
    from prometheus_client import REGISTRY

    def series(tid: str) -> int:
        return sum(1 for m in REGISTRY.collect() if m.name.startswith("mutualrl_thl_")
                   for s in m.samples if s.labels.get("target") == tid)

    async with _client(server) as thl:
        await thl.register("gone/p", str(root / "byte_bpe"), run_id="gone")
        await thl.register("kept/p", str(root / "wordpiece"), run_id="kept")
        for tid in ("gone/p", "kept/p"):
            src = (await thl.retokenize(tid, ["hello world"]))[0]
            item = TraceItem("hello world", src.token_ids, np.zeros(len(src.token_ids)))
            await thl.align_trace(tid, tid, [item])
        before = series("gone/p")
        assert before > 20 and series("kept/p") == before
        assert await thl.delete_run("gone") == 1
        assert series("gone/p") == 0 and series("kept/p") == before


ALIGN_TRACE = "/mutualrl.v1.Alignment/AlignTrace"


async def test_large_align_trace_is_refused_from_its_lengths_naming_the_field(
        server: ThlServer, root: Path) -> None:
    """Over-long source traces, a value short and an item that does not parse are refused
    from the request's lengths (INVALID_ARGUMENT naming the item's field), before any work."""
    text = "\U0001f389" * 16384  # 64 kB of emoji
    many = 1_000_000
    async with _client(server) as thl:
        await thl.register("bpe", str(root / "byte_bpe"))
        src = (await thl.retokenize("bpe", [text]))[0]
        n = len(src.token_ids)
        cases = [
            ([TraceItem(text, np.zeros(many, dtype=np.int64), np.zeros(many))],
             "items[0].source_token_ids"),
            ([TraceItem(text, src.token_ids, np.zeros(n)),
              TraceItem(text, src.token_ids, np.zeros(n - 1), src.offsets)], "items[1].values"),
            ([TraceItem(text, src.token_ids, np.zeros(n), src.offsets[:-1])],
             "items[0].source_offsets"),
        ]
        loads = server.engine.registry.loads
        for items, field in cases:
            err = await _error(thl.align_trace("bpe", "bpe", items))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, (field, err.details())
            assert (err.details() or "").startswith(f"{field}:"), err.details()
        assert server.engine.registry.loads == loads
    good = pb.AlignTraceRequest(source_tokenizer_id="bpe", target_tokenizer_id="bpe",
                                items=[pb.TraceItem(text="hi")]).SerializeToString()
    bad_item = good + b"\x1a\x03\x0a\x05h"  # a second item whose text runs past its end
    truncated = good + b"\x1a\x7f"  # an item longer than the body
    async with grpc.aio.insecure_channel(server.address) as channel:
        call = channel.unary_unary(ALIGN_TRACE)
        for body, field in ((bad_item, "items[1]"), (truncated, "request")):
            err = await _error(call(body, timeout=10))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
            assert (err.details() or "").startswith(f"{field}:"), err.details()


async def test_align_trace_is_refused_unread_while_the_request_budget_is_full(
        redis_url: str, run_id: str, root: Path) -> None:
    """While the calls being worked on hold the whole request budget, an AlignTrace is
    RESOURCE_EXHAUSTED naming the budget before its body is read (a body that does not parse
    gets the same answer), and the call holding it is answered."""
    limit = 1 << 20
    srv = await _start(redis_url, run_id, [root], max_inflight_request_bytes=limit,
                       request_wait_seconds=0, tokenizers={"bpe": str(root / "byte_bpe")})
    budget = srv.grpc.budget
    assert budget is not None
    try:
        async with _client(srv) as thl:
            text = "\U0001f389" * (1 << 17)  # 512 kB of emoji: a 5 MB request
            src = (await thl.retokenize("bpe", [text]))[0]
            item = TraceItem(text, src.token_ids, np.full(len(src.token_ids), -0.5),
                             src.offsets)
            busy = asyncio.ensure_future(thl.align_trace("bpe", "bpe", [item]))
            while budget.in_use < limit:
                assert not busy.done()
                await asyncio.sleep(0.001)
            async with grpc.aio.insecure_channel(srv.address) as channel:
                call = channel.unary_unary(ALIGN_TRACE)
                for body in (b"\xff" * 1000, pb.AlignTraceRequest(
                        source_tokenizer_id="bpe", target_tokenizer_id="bpe",
                        items=[pb.TraceItem(text="hi")]).SerializeToString()):
                    err = await _error(call(body, timeout=10))
                    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
                    assert (err.details() or "").startswith("request:"), err.details()
                    assert "max_inflight_request_bytes" in (err.details() or "")
                    assert "retry later" in (err.details() or "")
            res = await busy
            assert len(res.results[0].target_token_ids) == len(src.token_ids)
        assert budget.in_use == 0
    finally:
        await srv.stop(0)
