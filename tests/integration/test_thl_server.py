"""THL through the real gRPC server on 127.0.0.1 port 0 with the real Redis: the four RPCs, the
same answers as the in-process engine, clear errors for bad input (and the server keeps
serving), bearer auth, health/reflection, Prometheus metrics, registrations that survive a
restart and are shared by replicas, and `mutualrl thl serve` as a process."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import REGISTRY

from mutualrl.bench.testing.thl import trained_tokenizers
from mutualrl.client.thl import AsyncThlClient, ClientOptions, ThlClient
from mutualrl.common.alignment_types import TraceItem
from mutualrl.thl.config import ThlConfig
from mutualrl.thl.engine import AlignmentEngine
from mutualrl.thl.server import ThlServer, start_thl
from mutualrl.v1 import alignment_pb2 as pb
from mutualrl.v1 import alignment_pb2_grpc as pb_grpc

# Every tokenizer the tests register lives under the temporary directory.
TOKENIZER_ROOTS = [tempfile.gettempdir()]
TEXTS = ["Hello  wörld, 日本語 🎉 e\u0301!", "", "the quick fox\n\n  jumps 42"]


@pytest.fixture(scope="module")
def paths() -> dict[str, str]:
    return trained_tokenizers()


def _cfg(redis_url: str, run_id: str, **kw: object) -> ThlConfig:
    fields: dict[str, object] = {"port": 0, "metrics_port": None, "redis_url": redis_url,
                                 "key_prefix": run_id, "tokenizer_roots": TOKENIZER_ROOTS, **kw}
    return ThlConfig.model_validate(fields)


@pytest.fixture
async def server(redis_url: str, run_id: str, paths: dict[str, str]) -> AsyncIterator[ThlServer]:
    srv = await start_thl(_cfg(redis_url, run_id, max_text_bytes=4096, max_batch=8,
                               tokenizers={k: paths[k] for k in ("byte_bpe", "wordpiece")}))
    yield srv
    await srv.stop(0)


def _items(engine: AlignmentEngine, tokenizer_id: str) -> list[TraceItem]:
    out = []
    for i, enc in enumerate(engine.retokenize(tokenizer_id, TEXTS)):
        vals = (-np.abs(np.random.default_rng(i).standard_normal(len(enc.token_ids)))
                ).astype(np.float32).astype(np.float64)
        out.append(TraceItem(enc.text, enc.token_ids, vals, enc.offsets))
    return out


async def test_rpcs_match_the_in_process_engine(server: ThlServer, paths: dict[str, str]) -> None:
    async with AsyncThlClient(address=server.address) as thl:
        info = await thl.register("uni", paths["unigram"])
        assert info.model_type == "Unigram" and info.normalizer == "NFKC"
        assert [i.tokenizer_id for i in await thl.list()] == ["byte_bpe", "uni", "wordpiece"]
        local = AlignmentEngine()
        local.register("byte_bpe", paths["byte_bpe"])
        local.register("uni", paths["unigram"])
        remote_tok = await thl.retokenize("uni", TEXTS)
        local_tok = local.retokenize("uni", TEXTS)
        for r, loc in zip(remote_tok, local_tok, strict=True):
            assert r.token_ids.tolist() == loc.token_ids.tolist()
            assert r.offsets.tolist() == loc.offsets.tolist() and r.residual == loc.residual
        items = _items(local, "byte_bpe")
        for mode, placement in (("chunk", "last"), ("chunk", "spread"), ("sequence", "last")):
            remote = await thl.align_trace("byte_bpe", "uni", items, mode, placement)
            ref = local.align_trace("byte_bpe", "uni", items, mode, placement)
            assert remote.residual == ref.residual
            for a, b in zip(remote.results, ref.results, strict=True):
                assert a.target_token_ids.tolist() == b.target_token_ids.tolist()
                assert a.target_values.tolist() == b.target_values.tolist()
                assert a.sequence_value == b.sequence_value and a.mass_error == b.mass_error
                for f in ("char_start", "char_end", "source_start", "source_end",
                          "target_start", "target_end", "value", "clean"):
                    assert getattr(a.chunks, f).tolist() == getattr(b.chunks, f).tolist()


async def test_sync_client(server: ThlServer) -> None:
    def work() -> tuple[list[str], list[int]]:
        with ThlClient(ClientOptions(address=server.address)) as thl:
            ids = [i.tokenizer_id for i in thl.list()]
            enc = thl.retokenize("byte_bpe", ["abc abc"])[0]
            out = thl.align_trace("byte_bpe", "wordpiece", [
                TraceItem("abc abc", enc.token_ids, [-1.0] * len(enc.token_ids), enc.offsets)])
            return ids, out.results[0].target_token_ids.tolist()

    ids, target = await asyncio.to_thread(work)
    assert ids == ["byte_bpe", "wordpiece"] and len(target) >= 3


async def _expect(code: grpc.StatusCode, fragment: str, call: object) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    assert err.value.code() == code, err.value.details()
    assert fragment in (err.value.details() or ""), err.value.details()


async def test_bad_input_gets_clear_errors_and_server_keeps_serving(server: ThlServer) -> None:
    channel = grpc.aio.insecure_channel(server.address)
    stub = pb_grpc.AlignmentStub(channel)
    ok = pb.TraceItem(text="ab", source_token_ids=[70, 71], source_offset_starts=[0, 1],
                      source_offset_ends=[1, 2], values=[-1.0, -2.0])
    good = pb.AlignTraceRequest(source_tokenizer_id="byte_bpe", target_tokenizer_id="wordpiece",
                                items=[ok])
    cases = [
        (grpc.StatusCode.NOT_FOUND, "target_tokenizer_id: no tokenizer registered as 'nope'",
         pb.AlignTraceRequest(source_tokenizer_id="byte_bpe", target_tokenizer_id="nope",
                              items=[ok])),
        (grpc.StatusCode.INVALID_ARGUMENT, "items[0].values: 1 values for 2 source tokens",
         pb.AlignTraceRequest(source_tokenizer_id="byte_bpe", target_tokenizer_id="wordpiece",
                              items=[pb.TraceItem(text="ab", source_token_ids=[70, 71],
                                                  values=[-1.0])])),
        (grpc.StatusCode.INVALID_ARGUMENT, "items[0].source_offset_ends: 1 ends for 2 starts",
         pb.AlignTraceRequest(source_tokenizer_id="byte_bpe", target_tokenizer_id="wordpiece",
                              items=[pb.TraceItem(text="ab", source_token_ids=[70, 71],
                                                  source_offset_starts=[0, 1],
                                                  source_offset_ends=[2], values=[0, 0])])),
        (grpc.StatusCode.INVALID_ARGUMENT, "items[0].text: is 5000 bytes of UTF-8, over the "
         "4096-byte limit",
         pb.AlignTraceRequest(source_tokenizer_id="byte_bpe", target_tokenizer_id="wordpiece",
                              items=[pb.TraceItem(text="x" * 5000)])),
        (grpc.StatusCode.INVALID_ARGUMENT, "items: more than 8 entries, over the limit of 8",
         pb.AlignTraceRequest(source_tokenizer_id="byte_bpe", target_tokenizer_id="wordpiece",
                              items=[pb.TraceItem()] * 9)),
        (grpc.StatusCode.INVALID_ARGUMENT, "mode: unknown AlignMode 7",
         pb.AlignTraceRequest(source_tokenizer_id="byte_bpe", target_tokenizer_id="wordpiece",
                              items=[ok], mode=7)),  # type: ignore[arg-type]
    ]
    for code, fragment, request in cases:
        await _expect(code, fragment, stub.AlignTrace(request))
        assert len((await stub.AlignTrace(good)).results) == 1  # still serving
    await _expect(grpc.StatusCode.NOT_FOUND, "tokenizer_id: no tokenizer registered as 'x'",
                  stub.Retokenize(pb.RetokenizeRequest(tokenizer_id="x", texts=["a"])))
    await _expect(grpc.StatusCode.INVALID_ARGUMENT, "path:",
                  stub.RegisterTokenizer(pb.RegisterTokenizerRequest(tokenizer_id="y",
                                                                     path="/nonexistent")))
    # Invalid UTF-8 in a string field. Python protobuf cannot build such a message (str is
    # always valid Unicode), so the bytes are written by hand and sent through a raw stub:
    # field 1 tokenizer_id = "byte_bpe", field 2 texts = b"\xff\xfe".
    raw = b"\x0a\x08byte_bpe" + b"\x12\x02\xff\xfe"
    send_raw = channel.unary_unary("/mutualrl.v1.Alignment/Retokenize",
                                   request_serializer=lambda b: b,
                                   response_deserializer=pb.RetokenizeResponse.FromString)
    await _expect(grpc.StatusCode.INVALID_ARGUMENT,
                  "request: body is not a valid mutualrl.v1.RetokenizeRequest", send_raw(raw))
    valid_raw = pb.RetokenizeRequest(tokenizer_id="byte_bpe", texts=["ok"]).SerializeToString()
    assert len((await send_raw(valid_raw)).results[0].token_ids) >= 1
    await channel.close()


async def test_auth_health_reflection_and_metrics(redis_url: str, run_id: str,
                                                  paths: dict[str, str]) -> None:
    srv = await start_thl(_cfg(redis_url, run_id, auth_token="s3cret", metrics_port=0,
                               tokenizers={"byte_bpe": paths["byte_bpe"]}))
    try:
        for token in (None, "wrong"):
            async with AsyncThlClient(ClientOptions(address=srv.address, token=token or "",
                                                    outage_budget=0)) as thl:
                await _expect(grpc.StatusCode.UNAUTHENTICATED, "bearer token", thl.list())
        async with AsyncThlClient(ClientOptions(address=srv.address, token="s3cret")) as thl:
            assert [i.tokenizer_id for i in await thl.list()] == ["byte_bpe"]
            before = REGISTRY.get_sample_value(
                "mutualrl_thl_multi_token_chunk_share_count", {"target": "byte_bpe"}) or 0.0
            enc = (await thl.retokenize("byte_bpe", ["Hi there 日本"]))[0]
            item = TraceItem(enc.text, enc.token_ids, [-0.5] * len(enc.token_ids), enc.offsets)
            await thl.align_trace("byte_bpe", "byte_bpe", [item, item])
            after = REGISTRY.get_sample_value(
                "mutualrl_thl_multi_token_chunk_share_count", {"target": "byte_bpe"})
            assert after == before + 2
        async with grpc.aio.insecure_channel(srv.address) as channel:
            # Health is exempt from auth (Kubernetes probes cannot send tokens).
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(
                service="mutualrl.v1.Alignment"))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            refl = reflection_pb2_grpc.ServerReflectionStub(channel)
            md = (("authorization", "Bearer s3cret"),)
            responses = [r async for r in refl.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=md)]
            names = {s.name for s in responses[0].list_services_response.service}
            assert "mutualrl.v1.Alignment" in names
        assert srv.grpc.metrics_port
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{srv.grpc.metrics_port}/metrics", timeout=5).read().decode())
        assert "mutualrl_thl_roundtrip_mismatch_chars_bucket" in body
        assert 'mutualrl_thl_source_tokens_total{target="byte_bpe"}' in body
    finally:
        await srv.stop(0)


async def test_registrations_persist_in_redis_and_are_shared(redis_url: str, run_id: str,
                                                             paths: dict[str, str]) -> None:
    first = await start_thl(_cfg(redis_url, run_id))
    replica = await start_thl(_cfg(redis_url, run_id))
    try:
        async with AsyncThlClient(address=first.address) as a:
            await a.register("wp", paths["wordpiece"])
            expected = (await a.retokenize("wp", ["Shared Text"]))[0].token_ids.tolist()
        async with AsyncThlClient(address=replica.address) as b:  # never told about "wp"
            assert (await b.retokenize("wp", ["Shared Text"]))[0].token_ids.tolist() == expected
    finally:
        await first.stop(0)
        await replica.stop(0)
    key = f"{run_id}:thl:tokenizers"
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.hexists(key, "wp")
    finally:
        client.close()
    restarted = await start_thl(_cfg(redis_url, run_id))
    try:
        async with AsyncThlClient(address=restarted.address) as c:
            assert [i.tokenizer_id for i in await c.list()] == ["wp"]
            assert (await c.retokenize("wp", ["Shared Text"]))[0].token_ids.tolist() == expected
    finally:
        await restarted.stop(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_thl_serve_command(tmp_path: Path, paths: dict[str, str]) -> None:
    port = _free_port()
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"thl:\n  port: {port}\n  metrics_port: null\n  state_dir: {tmp_path}\n"
                   f"  tokenizer_roots: [{tempfile.gettempdir()}]\n"
                   f"  tokenizers:\n    char: {paths['char']}\n")
    exe = Path(sys.executable).parent / "mutualrl"
    proc = subprocess.Popen([str(exe), "thl", "serve", "--config", str(cfg)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "MUTUALRL_AUTH_TOKEN": ""})
    try:
        deadline = time.monotonic() + 60
        infos = None
        while time.monotonic() < deadline and infos is None:
            try:
                with ThlClient(ClientOptions(address=f"127.0.0.1:{port}", outage_budget=0,
                                             timeout=2)) as thl:
                    infos = thl.list()
            except grpc.RpcError:
                assert proc.poll() is None, proc.stdout.read().decode()  # type: ignore[union-attr]
                time.sleep(0.3)
        assert infos is not None and [i.tokenizer_id for i in infos] == ["char"]
        assert (tmp_path / "tokenizers.json").exists()
        # `mutualrl thl register --run-id`: a registration DeleteRun of the run releases.
        out = subprocess.run([str(exe), "thl", "register", "--addr", f"127.0.0.1:{port}",
                              "--id", "wp", "--path", paths["wordpiece"], "--run-id", "r1"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        with ThlClient(f"127.0.0.1:{port}", outage_budget=0) as thl:
            assert [i.tokenizer_id for i in thl.list()] == ["char", "wp"]
            assert thl.delete_run("r1") == 1
            assert [i.tokenizer_id for i in thl.list()] == ["char"]  # the pinned one stays
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


async def test_concurrent_calls_share_tokenizers_safely(server: ThlServer) -> None:
    local = AlignmentEngine()
    local.register("byte_bpe", trained_tokenizers()["byte_bpe"])
    local.register("wordpiece", trained_tokenizers()["wordpiece"])
    items = _items(local, "byte_bpe")
    ref = local.align_trace("byte_bpe", "wordpiece", items)
    async with AsyncThlClient(address=server.address) as thl:
        outs = await asyncio.gather(*(thl.align_trace("byte_bpe", "wordpiece", items)
                                      for _ in range(12)),
                                    *(thl.retokenize("wordpiece", TEXTS) for _ in range(12)))
    for out in outs[:12]:
        assert [r.target_values.tolist() for r in out.results] == [  # type: ignore[union-attr]
            r.target_values.tolist() for r in ref.results]


async def test_redis_down_is_unavailable_not_internal(paths: dict[str, str]) -> None:
    dead = f"redis://127.0.0.1:{_free_port()}/0"  # nothing listens there
    srv = await start_thl(ThlConfig(port=0, metrics_port=None, redis_url=dead,
                                    tokenizer_roots=TOKENIZER_ROOTS))
    try:
        async with AsyncThlClient(ClientOptions(address=srv.address, outage_budget=0)) as thl:
            await _expect(grpc.StatusCode.UNAVAILABLE, "redis", thl.register("a",
                                                                             paths["char"]))
            await _expect(grpc.StatusCode.UNAVAILABLE, "redis", thl.list())
    finally:
        await srv.stop(0)
