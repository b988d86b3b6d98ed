"""The REST routes SEE's dashboard is built from, against a real SEE, Redis and THL: metric rows
(ReportMetrics over gRPC, read back over REST), the transfer matrix over round windows, a record
under every receiver's tokenizer with THL's chunks, the residual matrix, the session route, auth
and the OpenAPI schema."""

from __future__ import annotations

import itertools
import math
import tempfile
from collections.abc import AsyncIterator
from typing import Any

import grpc
import httpx
import pytest

from mutualrl.bench.testing.see import (
    make_config,
    rollout,
    running_see,
    stats_record,
    success_record,
)
from mutualrl.client.see import AsyncSeeClient, ClientOptions, metric_row
from mutualrl.common import token_arrays as ta
from mutualrl.v1 import experience_pb2 as pb

TOKEN = "dash-secret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def tokenizers() -> dict[str, str]:
    from mutualrl.bench.testing.thl import trained_tokenizers

    return trained_tokenizers()


@pytest.fixture
async def thl(tokenizers: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    from mutualrl.thl.config import ThlConfig
    from mutualrl.thl.server import start_thl

    monkeypatch.delenv("MUTUALRL_AUTH_TOKEN", raising=False)
    cfg = ThlConfig(port=0, metrics_port=None, auth_token=TOKEN, state_dir=tempfile.mkdtemp(),
                    tokenizers={"tok-a": tokenizers["byte_bpe"], "tok-b": tokenizers["char"],
                                "tok-c": tokenizers["wordpiece"], "tok-d": tokenizers["byte_bpe"]})
    server = await start_thl(cfg)
    yield server
    await server.stop(0)


@pytest.fixture
async def see(redis_url: str, thl: Any) -> AsyncIterator[Any]:
    async with running_see(make_config(redis_url, auth_token=TOKEN,
                                       thl_address=thl.address)) as server:
        yield server


def _client(see: Any) -> AsyncSeeClient:
    return AsyncSeeClient(ClientOptions(address=see.address, token=TOKEN))


def _encoded(path: str, text: str, tokenizer_id: str, policy: str, record_id: str,
             round_: int = 0) -> pb.ExperienceRecord:
    """A ROLLOUT whose tokens and offsets come from the real tokenizer at `path`."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    enc = tok(text, return_offsets_mapping=True, add_special_tokens=False)
    n = len(enc["input_ids"])
    return ta.set_tokens(pb.ExperienceRecord(
        record_id=record_id, policy_id=policy, round=round_, prompt_id="p0", kind=pb.ROLLOUT,
        prompt_text="rev:3871=", text=text, tokenizer_id=tokenizer_id, reward=1.0,
        verified=True, finish_reason=pb.FINISH_REASON_STOP),
        enc["input_ids"], [s for s, _ in enc["offset_mapping"]],
        [e for _, e in enc["offset_mapping"]], [-0.25 - 0.01 * i for i in range(n)])


async def test_metric_rows_round_trip_with_cursor_and_policy_filter(see: Any,
                                                                    run_id: str) -> None:
    async with _client(see) as c:
        await c.create_run(run_id, ["a", "b", "c"])
        stored = await c.report_metrics(run_id, [
            metric_row(p, k, {"reward_mean": k / 10 + i, "heldout/add": 0.5}, unix_ms=1000 + k)
            for k in range(5) for i, p in enumerate(("a", "b", "c"))])
        assert stored == 15
    async with httpx.AsyncClient(base_url=see.rest_url, headers=AUTH) as h:
        r = (await h.get(f"/v1/runs/{run_id}/metrics")).json()
        assert len(r["rows"]) == 15 and r["more"] is False
        first = r["rows"][0]
        assert (first["policy_id"], first["round"], first["unix_ms"]) == ("a", 0, 1000)
        assert first["values"] == {"reward_mean": 0.0, "heldout/add": 0.5}
        # Paging: a cut page says `more`; reading on from its cursor gives the rest, in order.
        p1 = (await h.get(f"/v1/runs/{run_id}/metrics", params={"limit": 4})).json()
        assert len(p1["rows"]) == 4 and p1["more"] is True
        p2 = (await h.get(f"/v1/runs/{run_id}/metrics",
                          params={"after": p1["cursor"], "limit": 100})).json()
        assert [x["cursor"] for x in p1["rows"] + p2["rows"]] == [x["cursor"] for x in r["rows"]]
        # Polling from the end finds nothing new, then exactly the new row.
        idle = (await h.get(f"/v1/runs/{run_id}/metrics", params={"after": r["cursor"]})).json()
        assert idle["rows"] == [] and idle["cursor"] == r["cursor"]
        async with _client(see) as c:
            await c.report_metrics(run_id, [metric_row("b", 5, {"reward_mean": 9.0})])
        new = (await h.get(f"/v1/runs/{run_id}/metrics", params={"after": r["cursor"]})).json()
        assert [(x["policy_id"], x["round"], x["values"]) for x in new["rows"]] == \
            [("b", 5, {"reward_mean": 9.0})]
        only_b = (await h.get(f"/v1/runs/{run_id}/metrics", params={"policy": "b"})).json()
        assert [x["round"] for x in only_b["rows"]] == [0, 1, 2, 3, 4, 5]
        # Bad input: a 4xx naming the field.
        bad = await h.get(f"/v1/runs/{run_id}/metrics", params={"policy": "zz"})
        assert bad.status_code == 404 and bad.json()["field"] == "policy"
        bad = await h.get(f"/v1/runs/{run_id}/metrics", params={"after": "yesterday"})
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "after"]
        top = f"{2**64 - 1}-{2**64 - 1}"
        last = await h.get(f"/v1/runs/{run_id}/metrics", params={"after": top})
        assert last.status_code == 200 and last.json()["rows"] == [], last.text
        assert (await h.get("/v1/runs/no-such-run/metrics")).status_code == 404
        assert (await h.get(f"/v1/runs/{run_id}/metrics", params={"limit": 0})).status_code == 422


async def test_report_metrics_refuses_bad_rows_naming_the_field(see: Any, run_id: str) -> None:
    async with _client(see) as c:
        await c.create_run(run_id, ["a", "b"])
        cases = [
            ([metric_row("zz", 0, {"x": 1.0})], "rows[0].policy_id"),
            ([metric_row("a", 0, {"x": 1.0}), metric_row("a", -1, {"x": 1.0})], "rows[1].round"),
            ([metric_row("a", 0, {"loss": math.nan})], "rows[0].values[loss]: not finite"),
            ([metric_row("a", 0, {"bad\nname": 1.0})], "rows[0].values"),
            ([metric_row("a", 0, {f"k{i}": 1.0 for i in range(513)})], "rows[0].values"),
            ([], "rows"),
        ]
        for rows, field in cases:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.report_metrics(run_id, rows) if rows else await _report_empty(c, run_id)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert field in (err.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.report_metrics("no-such-run", [metric_row("a", 0, {"x": 1.0})])
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    # A refused batch stores nothing (validated as a whole).
    async with httpx.AsyncClient(base_url=see.rest_url, headers=AUTH) as h:
        assert (await h.get(f"/v1/runs/{run_id}/metrics")).json()["rows"] == []
    # Without the token: UNAUTHENTICATED.
    async with AsyncSeeClient(ClientOptions(address=see.address, token="wrong",
                                            outage_budget=0)) as c:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await c.report_metrics(run_id, [metric_row("a", 0, {"x": 1.0})])
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def _report_empty(c: AsyncSeeClient, run_id: str) -> None:
    from mutualrl.v1 import run_metrics_pb2 as mpb
    from mutualrl.v1 import run_metrics_pb2_grpc as mpb_grpc

    stub: Any = mpb_grpc.RunMetricsStub(c.channel)
    await stub.ReportMetrics(mpb.ReportMetricsRequest(run_id=run_id),
                             metadata=c.options.metadata())


async def test_transfer_windows_add_up_to_getrunstats(see: Any, run_id: str) -> None:
    async with _client(see) as c:
        await c.create_run(run_id, ["a", "b", "c"], tau=1.0)
        await c.publish(run_id, [rollout(p, r, f"p{i}", 0, n_tokens=4)
                                 for r in range(4) for p in ("a", "b", "c") for i in range(3)])
        await c.publish(run_id, [stats_record(p, r, "p0", [1.0, 0.0])
                                 for r in range(4) for p in ("b", "c")])
        await c.publish(run_id, [success_record("b", 1, "p1", "x = 1"),
                                 success_record("c", 3, "p2", "y = 2")])
        await c.take_peer_rollouts(run_id, "a", "a-0", max_records=20)  # rounds 0..3 of b, c
        await c.take_peer_rollouts(run_id, "b", "b-0", max_records=7)
        for r in range(4):
            await c.round_stats(run_id, r, ["p0"], policy_id="a")
        await c.successes(run_id, "a", ["p1", "p2"])
        stats = await c.run_stats(run_id)
    names = {v: k for k, v in pb.RecordKind.items()}
    totals = {(names[t.kind], t.taker_policy, t.source_policy): t.count for t in stats.transfers}
    assert totals[("REWARD_STATS", "a", "b")] == 4 and totals[("VERIFIED_SUCCESS", "a", "c")] == 1

    def flat(m: dict[str, Any]) -> dict[tuple[str, str, str], int]:
        return {(k, t, s): n for k, takers in m.items() for t, src in takers.items()
                for s, n in src.items()}

    async with httpx.AsyncClient(base_url=see.rest_url, headers=AUTH) as h:
        url = f"/v1/runs/{run_id}/transfers"
        whole = (await h.get(url)).json()
        assert flat(whole["matrix"]) == totals  # no window: GetRunStats' counts exactly
        assert (whole["first_round"], whole["last_round"]) == (0, 3)
        per_round = [flat((await h.get(url, params={"round_min": r, "round_max": r})).json()
                          ["matrix"]) for r in range(4)]
        summed: dict[tuple[str, str, str], int] = {}
        for m in per_round:
            for k, n in m.items():
                summed[k] = summed.get(k, 0) + n
        assert summed == totals  # the per-round counts add up to the run totals
        # Each round's counts are the records of that round: one REWARD_STATS of b per round,
        # the success of c in round 3 only.
        assert all(m[("REWARD_STATS", "a", "b")] == 1 for m in per_round)
        assert ("VERIFIED_SUCCESS", "a", "c") in per_round[3]
        assert all(("VERIFIED_SUCCESS", "a", "c") not in m for m in per_round[:3])
        half = flat((await h.get(url, params={"round_min": 0, "round_max": 1})).json()["matrix"])
        assert half == {k: per_round[0].get(k, 0) + per_round[1].get(k, 0)
                        for k in set(per_round[0]) | set(per_round[1])}
        open_ended = flat((await h.get(url, params={"round_min": 2})).json()["matrix"])
        assert open_ended == {k: per_round[2].get(k, 0) + per_round[3].get(k, 0)
                              for k in set(per_round[2]) | set(per_round[3])}
        assert (await h.get(url, params={"round_min": 100})).json()["matrix"] == {}
        inverted = await h.get(url, params={"round_min": 3, "round_max": 1})
        assert inverted.status_code == 200 and inverted.json()["matrix"] == {}
        assert (await h.get(url, params={"round_min": -1})).status_code == 422
        assert (await h.get("/v1/runs/no-such-run/transfers")).status_code == 404
        assert (await h.get("/v1/runs/no-such-run/transfers",
                            params={"round_min": 0})).status_code == 404


def _check_tiles(text: str, chunks: list[dict[str, Any]], n_src: int, n_dst: int) -> None:
    """THL's chunks tile the text and both token sequences contiguously."""
    assert chunks[0]["char_start"] == 0 and chunks[-1]["char_end"] == len(text)
    assert chunks[0]["source_start"] == 0 and chunks[-1]["source_end"] == n_src
    assert chunks[0]["target_start"] == 0 and chunks[-1]["target_end"] == n_dst
    for a, b in itertools.pairwise(chunks):
        assert a["char_end"] == b["char_start"]
        assert a["source_end"] == b["source_start"] and a["target_end"] == b["target_start"]


async def test_alignment_shows_every_receiver_with_thl_chunks(see: Any, run_id: str,
                                                              tokenizers: dict[str, str]) -> None:
    text = "1,7,8,3>1783; héllo wörld 🎉"
    rec = _encoded(tokenizers["byte_bpe"], text, "tok-a", "a", "a/0/0/0/r")
    rec.meta["rendered_prompt"] = "<|im_start|>user\nrev:3871=<|im_end|>\n"  # a's template
    async with _client(see) as c:
        await c.create_run(run_id, ["a", "b", "c", "d"])
        await c.publish(run_id, [
            rec,
            _encoded(tokenizers["char"], "12", "tok-b", "b", "b/0/0/0/r"),
            _encoded(tokenizers["wordpiece"], "12", "tok-c", "c", "c/0/0/0/r"),
            pb.ExperienceRecord(record_id="a/0/0/0/s", policy_id="a", round=0, prompt_id="p0",
                                kind=pb.VERIFIED_SUCCESS, text="1783;", tokenizer_id="tok-a",
                                reward=1.0, verified=True, finish_reason=pb.FINISH_REASON_STOP),
            stats_record("a", 0, "p0", [1.0, 0.0]),
        ])
    from transformers import AutoTokenizer

    async with httpx.AsyncClient(base_url=see.rest_url, headers=AUTH) as h:
        url = f"/v1/runs/{run_id}/alignment"
        a = (await h.get(url, params={"record_id": rec.record_id})).json()
        assert (a["text"], a["kind"], a["sender"]["source"]) == (text, "ROLLOUT", "record")
        # Both renderings: the problem that crossed, and the sender's own chat rendering.
        assert (a["prompt_text"], a["rendered_prompt"]) == (
            "rev:3871=", "<|im_start|>user\nrev:3871=<|im_end|>\n")
        assert [t["id"] for t in a["sender"]["tokens"]] == ta.token_ids(rec).tolist()
        assert [t["logprob"] for t in a["sender"]["tokens"]] == \
            pytest.approx(ta.logprobs(rec).tolist())
        by = {r["policy_id"]: r for r in a["receivers"]}
        assert set(by) == {"b", "c", "d"}
        for policy, family in (("b", "char"), ("c", "wordpiece")):
            r = by[policy]
            assert r["error"] is None and r["tokenizer_id"] == f"tok-{policy}"
            # The receiver's tokens are its tokenizer's encoding of the text.
            ids = AutoTokenizer.from_pretrained(tokenizers[family])(
                text, add_special_tokens=False)["input_ids"]
            assert [t["id"] for t in r["tokens"]] == ids
            _check_tiles(text, r["chunks"], ta.n_tokens(rec), len(ids))
            # Mass is conserved: the chunks' log-prob sums add up to the record's.
            assert sum(ch["logprob_sum"] for ch in r["chunks"]) == \
                pytest.approx(float(ta.logprobs(rec).sum()), abs=1e-5)
            assert 0.0 <= r["residual"]["multi_token_chunk_share"] <= 1.0
        # d has published nothing: its tokenizer is unknown, said so in place of the alignment.
        assert "published no record" in by["d"]["error"]
        # A record without tokens: THL encodes the sender side; no log-prob sums to show.
        s = (await h.get(url, params={"record_id": "a/0/0/0/s"})).json()
        assert s["sender"]["source"] == "thl" and len(s["sender"]["tokens"]) > 0
        assert all(ch["logprob_sum"] is None for ch in
                   next(r for r in s["receivers"] if r["policy_id"] == "b")["chunks"])
        st = (await h.get(url, params={"record_id": "a/0/p0/stats"})).json()
        assert "no completion text" in st["sender"]["error"]
        assert (await h.get(url, params={"record_id": "nope"})).status_code == 404
        assert (await h.get(url)).status_code == 422  # record_id is required
        assert (await h.get("/v1/runs/no-such-run/alignment",
                            params={"record_id": "x"})).status_code == 404


def _rendered(policy: str, round_: int, prompt: str, rendering: str | None
              ) -> pb.ExperienceRecord:
    rec = rollout(policy, round_, prompt, 0)
    if rendering is not None:
        rec.meta["rendered_prompt"] = rendering
    return rec


async def test_record_view_shows_every_policys_rendering_of_the_prompt(see: Any,
                                                                       run_id: str) -> None:
    chatml = "<|im_start|>user\nQuestion p0?<|im_end|>\n<|im_start|>assistant\n"
    llama = "<|start_header_id|>user<|end_header_id|>\n\nQuestion p0?<|eot_id|>"
    async with _client(see) as c:
        await c.create_run(run_id, ["a", "b", "c", "d"])
        # Each policy publishes its own records, each with its own rendering; b's round 2 is
        # the nearest to a's round 2, its round 0 and its other prompt are not.
        await c.publish(run_id, [_rendered("b", 0, "p0", "old " + llama),
                                 _rendered("c", 0, "p0", None)])
        await c.publish(run_id, [_rendered("a", 2, "p0", chatml),
                                 _rendered("b", 2, "p1", "other prompt")])
        await c.publish(run_id, [_rendered("b", 2, "p0", llama),
                                 _rendered("b", 5, "p0", "later " + llama)])
    async with httpx.AsyncClient(base_url=see.rest_url, headers=AUTH) as h:
        url = f"/v1/runs/{run_id}/alignment"
        a = (await h.get(url, params={"record_id": "a/2/p0/0"})).json()
        assert (a["prompt_text"], a["rendered_prompt"]) == ("Question p0?", chatml)
        assert a["peer_renderings"] == [
            {"policy_id": "b", "record_id": "b/2/p0/0", "round": 2, "rendered_prompt": llama},
            # c renders plain text (no meta); d has no rollout of the prompt.
            {"policy_id": "c", "record_id": "c/0/p0/0", "round": 0, "rendered_prompt": None},
            {"policy_id": "d", "record_id": None, "round": None, "rendered_prompt": None}]
        # Seen from b's record, a's rendering is the peer one: the view is symmetric.
        b = (await h.get(url, params={"record_id": "b/5/p0/0"})).json()
        assert b["rendered_prompt"] == "later " + llama
        assert b["peer_renderings"][0] == {"policy_id": "a", "record_id": "a/2/p0/0",
                                           "round": 2, "rendered_prompt": chatml}


async def test_residual_matrix_over_recent_records(see: Any, run_id: str,
                                                   tokenizers: dict[str, str]) -> None:
    texts = ["7+8=15c1,3+5+1=9>95;", "1.7.8.3>1783;", "17,83>1783; done"]
    recs = [_encoded(tokenizers[fam], t, tid, p, f"{p}/{r}/{i}/0/r", round_=r)
            for p, fam, tid in (("a", "byte_bpe", "tok-a"), ("b", "char", "tok-b"),
                                ("d", "byte_bpe", "tok-d"))
            for r in range(2) for i, t in enumerate(texts)]
    async with _client(see) as c:
        await c.create_run(run_id, ["a", "b", "d"])
        await c.publish(run_id, recs)
    async with httpx.AsyncClient(base_url=see.rest_url, headers=AUTH) as h:
        m = (await h.get(f"/v1/runs/{run_id}/residual", params={"sample": 4})).json()
        pairs = {(p["source_policy"], p["target_policy"]): p for p in m["pairs"]}
        assert set(pairs) == {(s, t) for s in "abd" for t in "abd" if s != t}
        assert all(p["error"] is None and p["records"] == 4 for p in pairs.values())
        # The same tokenizer on both sides aligns one to one: no residual.
        assert pairs[("a", "d")]["multi_token_chunk_share"] == 0.0
        assert pairs[("a", "d")]["source_tokens"] == pairs[("a", "d")]["target_tokens"]
        # Byte-level BPE merges characters: some of its tokens span several characters.
        assert pairs[("b", "a")]["multi_token_chunk_share"] > 0.0
        # Character level: one token per character of a's 4 newest texts (round 1's three,
        # then the last of round 0).
        assert pairs[("a", "b")]["target_tokens"] == sum(map(len, texts)) + len(texts[2])
        w = (await h.get(f"/v1/runs/{run_id}/residual",
                         params={"round_min": 0, "round_max": 0, "sample": 64})).json()
        assert all(p["records"] == 3 for p in w["pairs"])  # round 0 holds 3 texts per policy
        bad = await h.get(f"/v1/runs/{run_id}/residual", params={"sample": 65})
        assert bad.status_code == 422


async def test_without_thl_the_page_is_told_why(redis_url: str, run_id: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MUTUALRL_AUTH_TOKEN", raising=False)
    async with running_see(make_config(redis_url)) as see:
        async with AsyncSeeClient(ClientOptions(address=see.address)) as c:
            await c.create_run(run_id, ["a", "b"])
            await c.publish(run_id, [rollout("a", 0, "p0", 0), rollout("b", 0, "p0", 0)])
        async with httpx.AsyncClient(base_url=see.rest_url) as h:
            s = (await h.get("/v1/session")).json()
            assert s == {"auth_required": False, "authenticated": True, "thl": False}
            a = (await h.get(f"/v1/runs/{run_id}/alignment",
                             params={"record_id": "a/0/p0/0"})).json()
            assert len(a["sender"]["tokens"]) == 16  # the record's own tokens still show
            assert "thl_address" in a["receivers"][0]["error"]
            r = (await h.get(f"/v1/runs/{run_id}/residual")).json()
            assert all("thl_address" in p["error"] for p in r["pairs"])


async def test_session_auth_pages_and_openapi(see: Any, run_id: str) -> None:
    async with _client(see) as c:
        await c.create_run(run_id, ["a", "b"])
    async with httpx.AsyncClient(base_url=see.rest_url) as h:
        assert (await h.get("/v1/session")).json() == \
            {"auth_required": True, "authenticated": False, "thl": True}
        assert (await h.get("/v1/session", headers={"Authorization": "Bearer nope"})).json()[
            "authenticated"] is False
        assert (await h.get("/v1/session", headers=AUTH)).json()["authenticated"] is True
        # Every data route needs the token; the pages (no data) do not.
        for path in ("metrics", "transfers", "residual", "alignment?record_id=x"):
            assert (await h.get(f"/v1/runs/{run_id}/{path}")).status_code == 401
        page = await h.get(f"/ui/runs/{run_id}/records")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert '<script src="/ui/static/app.js" type="module">' in page.text
        for asset in ("app.js", "app.css", "views/records.js", "vendor/uPlot.iife.min.js"):
            r = await h.get(f"/ui/static/{asset}")
            assert r.status_code == 200 and r.headers["cache-control"] == "no-cache", asset
        assert (await h.get("/ui/static/missing.js")).status_code == 404
        assert (await h.get("/", follow_redirects=False)).headers["location"] == "/ui/"
        spec = (await h.get("/openapi.json")).json()
    paths = spec["paths"]
    wanted = {"/v1/session": "SessionOut", "/v1/runs/{run_id}/metrics": "MetricsOut",
              "/v1/runs/{run_id}/transfers": "TransferWindowOut",
              "/v1/runs/{run_id}/alignment": "AlignmentOut",
              "/v1/runs/{run_id}/residual": "ResidualMatrixOut"}
    for path, model in wanted.items():
        ok = paths[path]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
        assert ok == {"$ref": f"#/components/schemas/{model}"}, path
    schemas = spec["components"]["schemas"]
    assert set(schemas["ChunkOut"]["properties"]) >= {"char_start", "char_end", "logprob_sum",
                                                      "one_to_one"}
    assert "description" in schemas["MetricRowOut"]["properties"]["values"]
    assert not any(p.startswith("/ui") for p in paths)  # pages are not API routes
