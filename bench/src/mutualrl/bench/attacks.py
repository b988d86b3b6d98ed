"""`mutualrl bench see --memory`: the resident memory of SEE, MWRA and THL, each a
`mutualrl <service> serve` process with the run's secret set and default limits, under what an
attacker on the network can send, and under the largest calls a policy may make.

Per service, the attacks run one after another against one process; before each its peak
(VmHWM) is reset to its RSS (`base`); after each, `peak` is VmHWM - base and `parsed` the
request bodies the service parsed meanwhile (its `mutualrl_grpc_request_bodies` counter, read
from its /metrics; `read` the bodies it read off the wire):

- SEE: a 57 MiB ReportMetrics with no token (10 in turn, then 8 at once), a wrong token, the
  read token, another policy's token (rows of policy `a` under policy `b`'s token, its metadata
  naming policy `a` (`other_policy_token`) or none (`other_policy_token_unnamed`): refused
  from the metadata, unread); the same rows under `b`'s token with metadata that lies, naming
  `b` (`lying_policy_header`: the only refusal that needs the body, read and scanned from its
  lengths, not parsed; a policy may send that much for itself); a GetRoundStats of
  4,000,000 prompt ids (11 MiB) with no token and with `a`'s token (over the method's
  4 MiB limit: refused from its length); then 8 concurrent accepted maximal ReportMetrics of
  `a`'s own rows (admitted against the bytes budget, the rest RESOURCE_EXHAUSTED), and its RSS
  `settle_s` later (`settled`);
- MWRA: RegisterWorker with 1,000,000 labels (13 MiB), no token and with the secret (over
  the method's 4 MiB: refused from its length);
- THL: Retokenize of 1,000,000 one-character texts (3 MB) with the read token, refused for
  their count from the request's lengths, 8 times.

Targets: a refused call grows a service's peak by less than 16 MiB and parses no body; the
accepted ones peak within the service's documented bound and settle within 64 MiB of base; a
lying call parses no body and peaks within the bound.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from mutualrl.bench.testing.process import reset_peak, status, stop
from mutualrl.common.auth import bearer_metadata, derive_token
from mutualrl.v1 import alignment_pb2 as tpb
from mutualrl.v1 import allocation_pb2 as apb
from mutualrl.v1 import experience_pb2 as pb
from mutualrl.v1 import run_metrics_pb2 as mpb
from mutualrl.v1 import runs_pb2 as runs_pb

MiB = 1 << 20
SECRET = "bench-attack-secret"
REFUSED_GROWTH_MIB = 16
"""A refused call's largest peak growth allowed."""
SETTLED_MIB = 64
"""How far above its base a service's RSS may stay after the accepted calls."""
BOUND_MIB = {"SEE": 1024, "MWRA": 256, "THL": 640}
"""The peak each service's documented bound allows (docs/reliability.md)."""
SEE_METRICS = "/mutualrl.v1.RunMetrics/ReportMetrics"
ROUND_STATS = "/mutualrl.v1.ExperienceExchange/GetRoundStats"
REGISTER_WORKER = "/mutualrl.v1.Allocator/RegisterWorker"
RETOKENIZE = "/mutualrl.v1.Alignment/Retokenize"


@dataclass
class Service:
    """A started `mutualrl <kind> serve`: its pid, gRPC address and metrics port."""

    name: str
    pid: int
    address: str
    metrics_port: int

    def rss(self) -> int:
        return status(self.pid, "VmRSS")

    def metric(self, name: str, labels: str = "") -> float:
        """The sum of the service's Prometheus samples `name` whose labels hold `labels`
        (`stage="parsed"`)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                    timeout=10) as page:
            text = page.read().decode()
        return sum(float(v) for found, v in re.findall(
            rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M) if labels in found)

    def parsed(self) -> int:
        """Request bodies parsed since start, every method."""
        return int(self.metric("mutualrl_grpc_request_bodies_total", 'stage="parsed"'))

    def read(self) -> int:
        """Request bodies read off the wire since start, every method."""
        return int(self.metric("mutualrl_grpc_request_bodies_total", 'stage="read"'))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def serving(kind: str, section: dict[str, Any]) -> Iterator[Service]:
    """A `mutualrl <kind> serve` with the bench's secret and `section` as its config."""
    work = Path(tempfile.mkdtemp(prefix=f"{kind}-attacks-"))
    config = work / "run.yaml"
    metrics_port = _free_port()
    config.write_text(json.dumps({kind: {"port": 0, "metrics_port": metrics_port,
                                         "auth_token": SECRET, **section}}), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "MUTUALRL_AUTH_TOKEN"}
    with (work / "log").open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mutualrl.cli", "--log-level", "WARNING",
                                 kind, "serve", "--config", str(config)],
                                stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    try:
        assert proc.stdout is not None
        ready = re.search(r"listening on \S+:(\d+)", proc.stdout.readline())
        if ready is None:
            raise RuntimeError((work / "log").read_text())
        yield Service(kind.upper(), proc.pid, f"127.0.0.1:{ready.group(1)}", metrics_port)
    finally:
        stop(proc)
        shutil.rmtree(work, ignore_errors=True)


def metrics_request(run_id: str, policy: str, target_bytes: int) -> bytes:
    """A ReportMetricsRequest of about `target_bytes` that SEE accepts: rows of `policy` with
    512 values each, named to stay under a row's 64 KiB of JSON."""
    values = {f"m{i:03d}/" + "x" * 90: float(i) for i in range(512)}
    row = mpb.MetricRow(policy_id=policy, round=0, values=values)
    rows = max(1, min(1024, target_bytes // row.ByteSize()))
    return mpb.ReportMetricsRequest(
        run_id=run_id, rows=[mpb.MetricRow(policy_id=policy, round=r % 8, values=values)
                             for r in range(rows)]).SerializeToString()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def padded(message: bytes, size: int) -> bytes:
    """`message` with an unknown bytes field (number 1000) bringing it to `size` bytes."""
    tag = _varint(1000 << 3 | 2)
    for width in range(1, 6):
        length = size - len(message) - len(tag) - width
        if len(_varint(length)) == width:
            return message + tag + _varint(length) + b"\0" * length
    raise ValueError(f"cannot pad {len(message)} bytes to {size}")


Call = Callable[[], Awaitable[str]]


async def raw_answer(address: str, method: str, body: bytes, token: str | None,
                     timeout: float = 120, acts_for: str | None = None) -> tuple[str, str]:
    """One call of `method` with `body` as it is: its status code's name and details.
    `acts_for`: the policy the call's metadata names (`bearer_metadata`: by default a policy
    token's own, "" none)."""
    async with grpc.aio.insecure_channel(address, options=[
            ("grpc.max_send_message_length", 128 * MiB),
            ("grpc.max_receive_message_length", 128 * MiB)]) as channel:
        stub = channel.unary_unary(method)
        try:
            await stub(body, timeout=timeout, metadata=bearer_metadata(token, acts_for))
        except grpc.aio.AioRpcError as err:
            return err.code().name, err.details() or ""
        return "OK", ""


def raw_call(address: str, method: str, body: bytes, token: str | None,
             timeout: float = 120, acts_for: str | None = None) -> Call:
    """`raw_answer`'s status code name, as a call to make later."""

    async def call() -> str:
        return (await raw_answer(address, method, body, token, timeout, acts_for))[0]

    return call


async def measure(service: Service, calls: list[Call], concurrent: bool,
                  settle_s: float = 0.0) -> dict[str, Any]:
    """Run `calls` (in turn or at once) and report the service's memory around them."""
    await asyncio.sleep(0.5)
    base = service.rss()
    reset_peak(service.pid)
    read, parsed = service.read(), service.parsed()
    start = time.perf_counter()
    if concurrent:
        codes = list(await asyncio.gather(*(c() for c in calls)))
    else:
        codes = [await c() for c in calls]
    seconds = time.perf_counter() - start
    peak = status(service.pid, "VmHWM")
    out: dict[str, Any] = {
        "calls": len(calls), "codes": {c: codes.count(c) for c in sorted(set(codes))},
        "seconds": round(seconds, 2), "base_mib": round(base / MiB, 1),
        "peak_mib": round(peak / MiB, 1), "peak_growth_mib": round((peak - base) / MiB, 1),
        "read": service.read() - read, "parsed": service.parsed() - parsed}
    if settle_s:
        await asyncio.sleep(settle_s)
        out["settled_mib"] = round(service.rss() / MiB, 1)
        out["settled_growth_mib"] = round((service.rss() - base) / MiB, 1)
    return out


async def _see(redis_url: str, settle_s: float) -> dict[str, Any]:
    run_id = f"attack-{os.getpid()}"
    with serving("see", {"rest_port": None, "redis_url": redis_url,
                         "key_prefix": "mrlbench"}) as see:
        a, b = derive_token(SECRET, "policy:a"), derive_token(SECRET, "policy:b")
        read = derive_token(SECRET, "read")
        create = pb.CreateRunRequest(config=pb.RunConfig(run_id=run_id, policies=["a", "b"]),
                                     exist_ok=True).SerializeToString()
        assert await raw_call(see.address, "/mutualrl.v1.ExperienceExchange/CreateRun",
                              create, SECRET)() == "OK"
        body = metrics_request(run_id, "a", 57 * MiB)
        stats = pb.RoundStatsRequest(run_id=run_id, round=0, policy_id="a",
                                     prompt_ids=["p"] * 4_000_000).SerializeToString()
        out: dict[str, Any] = {"request_mib": round(len(body) / MiB, 1)}

        def metrics(token: str | None, acts_for: str | None = None) -> Call:
            return raw_call(see.address, SEE_METRICS, body, token, acts_for=acts_for)

        out["no_token_10"] = await measure(see, [metrics(None)] * 10, False)
        out["no_token_8_at_once"] = await measure(see, [metrics(None)] * 8, True)
        out["wrong_token"] = await measure(see, [metrics("policy.a.0000")] * 4, False)
        out["read_token"] = await measure(see, [metrics(read)] * 4, False)
        out["other_policy_token"] = await measure(see, [metrics(b, "a")] * 4, False)
        out["other_policy_token_unnamed"] = await measure(see, [metrics(b, "")] * 4, False)
        out["lying_policy_header"] = await measure(see, [metrics(b, "b")] * 4, False)
        out["round_stats_no_token"] = await measure(
            see, [raw_call(see.address, ROUND_STATS, stats, None)] * 4, False)
        out["round_stats_over_limit"] = await measure(
            see, [raw_call(see.address, ROUND_STATS, stats, a)] * 4, False)
        out["accepted_8_at_once"] = await measure(see, [metrics(a)] * 8, True, settle_s)
        await raw_call(see.address, "/mutualrl.v1.ExperienceExchange/DeleteRun",
                       runs_pb.DeleteRunRequest(run_id=run_id).SerializeToString(), SECRET)()
        return out


async def _refused(service: Service, method: str, body: bytes,
                   tokens: dict[str, str | None], calls: int = 8) -> dict[str, Any]:
    """`calls` calls in turn of `method` with `body` under each of `tokens` (attack name ->
    token), with the request's size."""
    out: dict[str, Any] = {"request_mib": round(len(body) / MiB, 1)}
    for name, token in tokens.items():
        out[name] = await measure(service, [raw_call(service.address, method, body, token)]
                                  * calls, False)
    return out


async def _mwra(redis_url: str) -> dict[str, Any]:
    with serving("mwra", {"redis_url": redis_url, "key_prefix": "mrlbench"}) as mwra:
        worker = apb.Worker(worker_id="w", labels={f"k{i}": "v" for i in range(1_000_000)})
        body = apb.RegisterWorkerRequest(run_id="attack", worker=worker).SerializeToString()
        return await _refused(mwra, REGISTER_WORKER, body,
                              {"no_token": None, "admin_over_limit": SECRET})


async def _thl() -> dict[str, Any]:
    with serving("thl", {"tokenizer_roots": [tempfile.gettempdir()]}) as thl:
        body = tpb.RetokenizeRequest(tokenizer_id="none", texts=["a"] * 1_000_000
                                     ).SerializeToString()
        return await _refused(thl, RETOKENIZE, body,
                              {"over_count": derive_token(SECRET, "read"), "no_token": None})


def verdict(results: dict[str, Any]) -> dict[str, Any]:
    """Each target met or missed, by service and attack."""
    checks: dict[str, bool] = {}
    for service, attacks in results.items():
        for name, got in attacks.items():
            if not isinstance(got, dict):
                continue
            if name.startswith("accepted"):
                checks[f"{service}.{name}.peak_within_bound"] = (
                    got["peak_mib"] <= BOUND_MIB[service])
                checks[f"{service}.{name}.settled"] = got["settled_growth_mib"] <= SETTLED_MIB
            elif name.startswith("lying"):
                checks[f"{service}.{name}.peak_within_bound"] = (
                    got["peak_mib"] <= BOUND_MIB[service])
                checks[f"{service}.{name}.parsed_none"] = got["parsed"] == 0
            else:
                checks[f"{service}.{name}.peak_growth"] = (
                    got["peak_growth_mib"] < REFUSED_GROWTH_MIB)
                checks[f"{service}.{name}.parsed_none"] = got["parsed"] == 0
    return {"checks": checks, "all_met": all(checks.values())}


def run_attacks(redis_url: str, settle_s: float = 10.0) -> dict[str, Any]:
    """Every attack against every service (see the module)."""

    async def run() -> dict[str, Any]:
        return {"SEE": await _see(redis_url, settle_s), "MWRA": await _mwra(redis_url),
                "THL": await _thl()}

    results = asyncio.run(run())
    return {"bench": "attacks-memory", "bounds_mib": BOUND_MIB, "results": results,
            **verdict(results), "load_average": list(os.getloadavg())}
