"""SEE's REST inspection API, bearer auth on gRPC and REST, and TLS on both."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
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
from mutualrl.client.see import AsyncSeeClient, ClientOptions
from mutualrl.common import token_arrays as ta


@pytest.fixture
async def see(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    monkeypatch.delenv("MUTUALRL_AUTH_TOKEN", raising=False)
    async with running_see(make_config(redis_url)) as server:
        yield server


async def _fill(see: Any, run_id: str) -> None:
    async with AsyncSeeClient(ClientOptions(address=see.address)) as c:
        await c.create_run(run_id, ["a", "b"], tau=1.0)
        await c.publish(run_id, [rollout(p, r, f"p{i}", 0, n_tokens=6, reward=float(i % 2))
                                 for r in range(3) for p in ("a", "b") for i in range(4)])
        await c.publish(run_id, [stats_record("a", 0, "p0", [1.0, 0.0]),
                                 success_record("b", 0, "p1", "x = 1")])
        await c.take_peer_rollouts(run_id, "a", "a-0", max_records=5)
        await c.successes(run_id, "a", ["p1"])
        await c.round_stats(run_id, 0, ["p0"], policy_id="b")


async def test_runs_policies_stats(see: Any, run_id: str) -> None:
    await _fill(see, run_id)
    async with httpx.AsyncClient(base_url=see.rest_url) as h:
        runs = (await h.get("/v1/runs")).json()["runs"]
        mine = next(r for r in runs if r["run_id"] == run_id)
        assert mine["policies"] == ["a", "b"] and mine["tau"] == 1.0
        assert mine["retention"]["max_stream_len"] == 100_000  # server default filled in
        pol = (await h.get(f"/v1/runs/{run_id}/policies")).json()["policies"]
        by = {p["policy_id"]: p for p in pol}
        assert by["a"]["published"] == {"ROLLOUT": 12, "REWARD_STATS": 1, "VERIFIED_SUCCESS": 0}
        assert by["b"]["published"] == {"ROLLOUT": 12, "REWARD_STATS": 0, "VERIFIED_SUCCESS": 1}
        assert by["a"]["total"] == 13
        assert (by["a"]["taken"], by["b"]["given"]) == (6, 6)
        stats = (await h.get(f"/v1/runs/{run_id}/stats")).json()
        assert stats["matrix"] == {"ROLLOUT": {"a": {"b": 5}},
                                   "VERIFIED_SUCCESS": {"a": {"b": 1}},
                                   "REWARD_STATS": {"b": {"a": 1}}}
        assert stats["stream_lengths"]["ROLLOUT"] == 24
        assert stats["duplicates"] == 0
        assert (await h.get("/v1/runs/nope-run/stats")).status_code == 404
        assert (await h.get("/healthz")).json() == {"status": "ok", "redis": True}
        docs = await h.get("/docs")
        assert docs.status_code == 200 and "swagger" in docs.text.lower()
        spec = (await h.get("/openapi.json")).json()
        assert "/v1/runs/{run_id}/records" in spec["paths"]
        metrics = (await h.get("/metrics")).text
        assert 'mutualrl_see_records_in_total{kind="ROLLOUT",status="stored"}' in metrics


async def test_records_filters_and_cursor_pagination(see: Any, run_id: str) -> None:
    await _fill(see, run_id)
    async with httpx.AsyncClient(base_url=see.rest_url) as h:
        url = f"/v1/runs/{run_id}/records"
        everything = (await h.get(url, params={"limit": 1000})).json()
        assert len(everything["records"]) == 26 and everything["next_cursor"] is None
        cursors = [r["cursor"] for r in everything["records"]]
        assert cursors == sorted(cursors, key=lambda c: tuple(map(int, c.split("-"))))
        # Page through b's ROLLOUTs of rounds 1..2, 3 at a time: 8 records, no repeats.
        seen: list[str] = []
        cursor = None
        for _ in range(10):
            params: dict[str, Any] = {"kind": "ROLLOUT", "policy": "b", "round_min": 1,
                                      "round_max": 2, "limit": 3}
            if cursor:
                params["cursor"] = cursor
            page = (await h.get(url, params=params)).json()
            seen += [r["record_id"] for r in page["records"]]
            assert all(r["policy_id"] == "b" and 1 <= r["round"] <= 2 for r in page["records"])
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert len(seen) == 8 and len(set(seen)) == 8
        assert [r["record_id"] for r in (await h.get(url, params={"prompt": "p1", "kind":
                                                                   "VERIFIED_SUCCESS"})
                                         ).json()["records"]] == ["b/0/p1/ok0"]
        verified = (await h.get(url, params={"verified": "true"})).json()["records"]
        assert [r["kind"] for r in verified] == ["VERIFIED_SUCCESS"]
        # Bad cursor / kind / limit: 4xx naming the field. The OpenAPI document states the
        # cursor's and kind's form, so FastAPI refuses them (422, the field in `loc`).
        for params in ({"cursor": "not-a-cursor"}, {"cursor": f"{2**64}-0"},  # #14 item 2
                       {"cursor": f"0-{2**64 + 5}"}, {"kind": "BOGUS"}):
            bad = await h.get(url, params=params)
            (field,) = params
            assert bad.status_code == 422, bad.text
            assert [d["loc"] for d in bad.json()["detail"]] == [["query", field]]
        # The largest id Redis takes is a valid cursor (an empty page after it).
        top = await h.get(url, params={"cursor": f"{2**64 - 1}-{2**64 - 1}"})
        assert top.status_code == 200 and top.json()["records"] == []
        bad = await h.get(url, params={"limit": 0})
        assert bad.status_code == 422 and "limit" in bad.text
        assert (await h.get("/v1/runs/missing-run/records")).status_code == 404


async def test_one_record_in_full(see: Any, run_id: str) -> None:
    await _fill(see, run_id)
    expected = rollout("b", 2, "p3", 0, n_tokens=6, reward=1.0)
    async with httpx.AsyncClient(base_url=see.rest_url) as h:
        rec = (await h.get(f"/v1/runs/{run_id}/records/b/2/p3/0")).json()
        assert rec["record_id"] == "b/2/p3/0" and rec["run_id"] == run_id
        assert rec["text"] == expected.text
        assert rec["token_ids"] == ta.token_ids(expected).tolist()
        assert rec["offset_starts"] == ta.offset_starts(expected).tolist()
        assert rec["offset_ends"] == ta.offset_ends(expected).tolist()
        assert rec["logprobs"] == pytest.approx(ta.logprobs(expected).tolist(), rel=1e-6)
        assert rec["reward"] == 1.0 and rec["finish_reason"] == "EOS"
        assert rec["meta"] == {"skill": "add"}
        st = (await h.get(f"/v1/runs/{run_id}/records/a/0/p0/stats")).json()
        assert st["stats"] == {"count": 2, "sum": 1.0, "sum_sq": 1.0, "max": 1.0}
        missing = await h.get(f"/v1/runs/{run_id}/records/zz/9")
        assert missing.status_code == 404 and missing.json()["field"] == "record_id"


async def test_auth_on_grpc_and_rest(redis_url: str, run_id: str,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MUTUALRL_AUTH_TOKEN", raising=False)
    async with running_see(make_config(redis_url, auth_token="s3cret")) as see:
        for token in (None, "wrong"):
            async with AsyncSeeClient(ClientOptions(address=see.address, token=token,
                                                    outage_budget=0)) as c:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await c.create_run(run_id, ["a"], tau=1.0)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await c.list_runs()
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        async with AsyncSeeClient(ClientOptions(address=see.address, token="s3cret")) as c:
            await c.create_run(run_id, ["a", "b"], tau=1.0)
            assert (await c.publish(run_id, [rollout("a", 0, "p", 0)])).stored == 1
        async with httpx.AsyncClient(base_url=see.rest_url) as h:
            for path in ("/v1/runs", f"/v1/runs/{run_id}/records", f"/v1/runs/{run_id}/stats",
                         "/metrics"):
                assert (await h.get(path)).status_code == 401
                assert (await h.get(path, headers={"Authorization": "Bearer nope"})
                        ).status_code == 401
                ok = await h.get(path, headers={"Authorization": "Bearer s3cret"})
                assert ok.status_code == 200, path
            assert (await h.get("/healthz")).status_code == 200


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


async def test_tls_on_grpc_and_rest(redis_url: str, run_id: str, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MUTUALRL_AUTH_TOKEN", raising=False)
    cert, key = _self_signed(tmp_path)
    cfg = make_config(redis_url, tls_cert=cert, tls_key=key, auth_token="tok")
    async with running_see(cfg) as see:
        opts = ClientOptions(address=f"localhost:{see.grpc.port}", tls_ca=cert, token="tok")
        async with AsyncSeeClient(opts) as c:
            await c.create_run(run_id, ["a", "b"], tau=1.0)
            assert (await c.publish(run_id, [rollout("a", 0, "p", 0)])).stored == 1
        # A plaintext client cannot talk to the TLS port.
        async with AsyncSeeClient(ClientOptions(address=f"localhost:{see.grpc.port}",
                                                token="tok", outage_budget=0, timeout=2)) as c:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await c.list_runs()
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert see.rest_url.startswith("https://")
        async with httpx.AsyncClient(base_url=f"https://localhost:{see.rest_port}",
                                     verify=ssl.create_default_context(cafile=str(cert))) as h:
            r = await h.get(f"/v1/runs/{run_id}/policies", headers={"Authorization":
                                                                     "Bearer tok"})
            assert r.status_code == 200
            assert r.json()["policies"][0]["published"]["ROLLOUT"] == 1


async def test_inspect_commands(see: Any, run_id: str, capsys: pytest.CaptureFixture[str]
                                ) -> None:
    import asyncio
    import json

    from mutualrl.cli import main

    await _fill(see, run_id)

    async def run(*argv: str) -> str:
        capsys.readouterr()
        assert await asyncio.to_thread(main, list(argv)) == 0
        return capsys.readouterr().out

    url = ("--url", see.rest_url)
    runs = json.loads(await run("inspect", "runs", *url, "--json"))["runs"]
    assert run_id in [r["run_id"] for r in runs]
    assert "SEE runs" in await run("inspect", "runs", *url)
    pol = json.loads(await run("inspect", "policies", run_id, *url, "--json"))
    assert {p["policy_id"]: p["total"] for p in pol["policies"]} == {"a": 13, "b": 13}
    table = await run("inspect", "policies", run_id, *url)
    assert "VERIFIED_SUCCESS" in table or "VERIFIED_SUCC" in table
    recs = json.loads(await run("inspect", "records", run_id, *url, "--json", "--kind",
                                "ROLLOUT", "--policy", "b", "--round-min", "2", "--limit", "2"))
    assert [r["record_id"] for r in recs["records"]] == ["b/2/p0/0", "b/2/p1/0"]
    more = json.loads(await run("inspect", "records", run_id, *url, "--json", "--kind",
                                "ROLLOUT", "--policy", "b", "--round-min", "2",
                                "--cursor", recs["next_cursor"]))
    assert [r["record_id"] for r in more["records"]] == ["b/2/p2/0", "b/2/p3/0"]
    full = await run("inspect", "record", run_id, "b/2/p3/0", *url)
    assert "tokens" in full and "b/2/p3/0" in full
    xfer = json.loads(await run("inspect", "transfers", run_id, *url, "--json"))
    assert xfer["matrix"]["ROLLOUT"] == {"a": {"b": 5}}
    assert "taker" in await run("inspect", "transfers", run_id, *url)
    with pytest.raises(SystemExit, match="HTTP 404"):
        await asyncio.to_thread(main, ["inspect", "policies", "no-such-run", *url])
