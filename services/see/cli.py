"""`mutualrl see serve`, `mutualrl inspect runs|policies|records|record|transfers` and
`mutualrl bench see`."""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from mutualrl.cli import Commands


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from mutualrl.common.config import load_section
    from mutualrl.see.config import SeeConfig

    cfg = load_section(args.config, "see", SeeConfig, port=args.port, rest_port=args.rest_port,
                       redis_url=args.redis_url, host=args.host, workers=args.workers)
    made_dir = None
    if cfg.workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        import tempfile

        # Set before prometheus_client is first imported (by the server module below), and
        # inherited by the workers: /metrics then sums every process.
        made_dir = tempfile.mkdtemp(prefix="see-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = made_dir
    from mutualrl.see.server import serve

    try:
        asyncio.run(serve(cfg))
    finally:
        if made_dir is not None:
            import shutil

            shutil.rmtree(made_dir, ignore_errors=True)
    return 0


# ------------------------------------------------------------------------------------ inspect

def _get(args: argparse.Namespace, path: str, params: dict[str, Any] | None = None) -> Any:
    """GET a SEE REST route; exits with the server's message on an HTTP error."""
    query = urllib.parse.urlencode({k: v for k, v in (params or {}).items() if v is not None})
    url = args.url.rstrip("/") + path + (f"?{query}" if query else "")
    req = urllib.request.Request(url)
    token = args.token or os.environ.get("MUTUALRL_AUTH_TOKEN")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=args.timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as err:
        body = err.read().decode(errors="replace")
        try:
            detail = json.loads(body).get("detail", body)
        except ValueError:
            detail = body
        raise SystemExit(f"{url}: HTTP {err.code}: {detail}") from None
    except urllib.error.URLError as err:
        raise SystemExit(f"{url}: {err.reason}") from None


def _print(args: argparse.Namespace, data: Any, table: Any) -> int:
    from rich.console import Console

    if args.json:
        print(json.dumps(data, indent=2))
    else:
        Console().print(table)
    return 0


def _inspect_runs(args: argparse.Namespace) -> int:
    from rich.table import Table

    data = _get(args, "/v1/runs")
    t = Table(title="SEE runs")
    for col in ("run", "policies", "tau", "max_stream_len", "ttl_s", "max_rounds", "created"):
        t.add_column(col, overflow="fold")
    import datetime as dt

    for r in data["runs"]:
        ret = r["retention"]
        created = dt.datetime.fromtimestamp(r["created_unix_ms"] / 1000, dt.UTC)
        t.add_row(r["run_id"], ", ".join(r["policies"]), f"{r['tau']:g}",
                  str(ret["max_stream_len"]), str(ret["ttl_seconds"]), str(ret["max_rounds"]),
                  created.strftime("%Y-%m-%d %H:%M:%S"))
    return _print(args, data, t)


def _inspect_policies(args: argparse.Namespace) -> int:
    from rich.table import Table

    data = _get(args, f"/v1/runs/{urllib.parse.quote(args.run, safe='')}/policies")
    t = Table(title=f"policies of {args.run}")
    for col in ("policy", "ROLLOUT", "REWARD_STATS", "VERIFIED_SUCCESS", "total", "taken",
                "given"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for p in data["policies"]:
        pub = p["published"]
        t.add_row(p["policy_id"], *(str(pub.get(k, 0)) for k in
                                    ("ROLLOUT", "REWARD_STATS", "VERIFIED_SUCCESS")),
                  str(p["total"]), str(p["taken"]), str(p["given"]))
    return _print(args, data, t)


def _inspect_records(args: argparse.Namespace) -> int:
    from rich.table import Table

    params = {"kind": args.kind, "policy": args.policy, "prompt": args.prompt,
              "round_min": args.round_min, "round_max": args.round_max,
              "verified": None if args.verified is None else str(args.verified).lower(),
              "cursor": args.cursor, "limit": args.limit}
    data = _get(args, f"/v1/runs/{urllib.parse.quote(args.run, safe='')}/records", params)
    t = Table(title=f"records of {args.run}",
              caption=f"next cursor: {data['next_cursor'] or '(end)'}")
    for col in ("cursor", "record", "kind", "policy", "round", "prompt", "reward", "verified",
                "tokens", "text"):
        t.add_column(col, overflow="fold")
    for r in data["records"]:
        t.add_row(r["cursor"], r["record_id"], r["kind"], r["policy_id"], str(r["round"]),
                  r["prompt_id"], f"{r['reward']:g}", "yes" if r["verified"] else "no",
                  str(r["num_tokens"]), r["text_preview"][:40])
    return _print(args, data, t)


def _inspect_record(args: argparse.Namespace) -> int:
    from rich.table import Table

    run = urllib.parse.quote(args.run, safe="")
    rid = urllib.parse.quote(args.record_id, safe="/")
    data = _get(args, f"/v1/runs/{run}/records/{rid}")
    t = Table(title=f"{args.record_id} ({data['kind']}, {data['policy_id']}, round "
                    f"{data['round']})", show_header=True)
    t.add_column("field")
    t.add_column("value", overflow="fold")
    for key in ("prompt_id", "policy_version", "reward", "verified", "finish_reason",
                "tokenizer_id", "prompt_text", "text", "stats", "meta", "created_unix_ms"):
        t.add_row(key, str(data[key]))
    toks = Table(title="tokens")
    for col in ("#", "id", "start", "end", "text", "logprob"):
        toks.add_column(col)
    text = data["text"]
    for i, (tid, s, e, lp) in enumerate(zip(data["token_ids"], data["offset_starts"],
                                            data["offset_ends"], data["logprobs"], strict=True)):
        if i >= args.max_tokens:
            toks.add_row("...", "", "", "", "", "")
            break
        toks.add_row(str(i), str(tid), str(s), str(e), repr(text[s:e]), f"{lp:.4f}")
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    from rich.console import Console

    console = Console()
    console.print(t)
    if data["token_ids"]:
        console.print(toks)
    return 0


def _inspect_transfers(args: argparse.Namespace) -> int:
    from rich.console import Group
    from rich.table import Table

    data = _get(args, f"/v1/runs/{urllib.parse.quote(args.run, safe='')}/stats")
    policies = [p["policy_id"] for p in data["policies"]]
    tables = []
    for kind in ("ROLLOUT", "REWARD_STATS", "VERIFIED_SUCCESS"):
        mat = data["matrix"].get(kind, {})
        t = Table(title=f"{kind}: records of source (column) taken by taker (row)")
        t.add_column("taker \\ source")
        for p in policies:
            t.add_column(p, justify="right")
        for taker in policies:
            t.add_row(taker, *(str(mat.get(taker, {}).get(src, 0)) if src != taker else "-"
                               for src in policies))
        tables.append(t)
    foot = Table(title="retention and duplicates")
    foot.add_column("what")
    foot.add_column("value", justify="right")
    for name, n in sorted(data["stream_lengths"].items()):
        foot.add_row(f"held {name}", str(n))
    for name, n in sorted(data["trimmed"].items()):
        foot.add_row(f"trimmed {name}", str(n))
    foot.add_row("duplicates", str(data["duplicates"]))
    tables.append(foot)
    return _print(args, data, Group(*tables))


def _rest_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=os.environ.get("MUTUALRL_SEE_REST", "http://127.0.0.1:8080"),
                   help="SEE REST base URL (default $MUTUALRL_SEE_REST or http://127.0.0.1:8080).")
    p.add_argument("--token", default=None, help="Bearer token (default $MUTUALRL_AUTH_TOKEN).")
    p.add_argument("--timeout", type=float, default=10.0, help="HTTP timeout in seconds.")
    p.add_argument("--json", action="store_true", help="Print the JSON answer instead of tables.")


def _bench(args: argparse.Namespace) -> int:
    from mutualrl.see.bench import main as bench_main

    return bench_main(args)


def register(commands: Commands) -> None:
    commands.group(["see"], "Shared Experience Exchange (SEE).")
    p = commands.add(["see", "serve"], "Serve SEE: gRPC (experience.proto) plus the REST "
                     "inspection API, backed by Redis.", _serve)
    p.add_argument("--config", default=None, help="Run YAML; its `see:` section configures SEE.")
    p.add_argument("--port", type=int, default=None, help="gRPC port (default 50051).")
    p.add_argument("--rest-port", type=int, default=None, help="REST port (default 8080).")
    p.add_argument("--redis-url", default=None,
                   help="Redis URL (default $REDIS_URL, else redis://127.0.0.1:6379/0).")
    p.add_argument("--host", default=None, help="Bind address (default from config, 127.0.0.1).")
    p.add_argument("--workers", type=int, default=None,
                   help="gRPC worker processes sharing the port (default from config, 1).")

    commands.group(["inspect"], "Inspect a running MutualRL deployment.")
    p = commands.add(["inspect", "runs"], "List SEE runs with their config.", _inspect_runs)
    _rest_args(p)
    p = commands.add(["inspect", "policies"], "Policies of a run with their record counts.",
                     _inspect_policies)
    _rest_args(p)
    p.add_argument("run", help="Run id.")
    p = commands.add(["inspect", "records"], "Records of a run, filtered, one page at a time.",
                     _inspect_records)
    _rest_args(p)
    p.add_argument("run", help="Run id.")
    p.add_argument("--kind", choices=["ROLLOUT", "REWARD_STATS", "VERIFIED_SUCCESS"])
    p.add_argument("--policy", help="Producing policy.")
    p.add_argument("--prompt", help="Prompt id.")
    p.add_argument("--round-min", type=int, help="Smallest round.")
    p.add_argument("--round-max", type=int, help="Largest round.")
    p.add_argument("--verified", type=lambda s: s.lower() in ("1", "true", "yes"),
                   default=None, help="true/false: verifier outcome.")
    p.add_argument("--cursor", help="next cursor printed under the previous page.")
    p.add_argument("--limit", type=int, default=50, help="Page size (1..1000).")
    p = commands.add(["inspect", "record"], "One record in full (text, tokens, log-probs).",
                     _inspect_record)
    _rest_args(p)
    p.add_argument("run", help="Run id.")
    p.add_argument("record_id", help="Record id.")
    p.add_argument("--max-tokens", type=int, default=64, help="Token rows to print.")
    p = commands.add(["inspect", "transfers"],
                     "Transfer matrix of a run: records of each source taken by each taker.",
                     _inspect_transfers)
    _rest_args(p)
    p.add_argument("run", help="Run id.")

    p = commands.add(["bench", "see"], "SEE Publish throughput against raw Redis pipelines "
                     "(same payloads, writers and batch size).", _bench)
    p.add_argument("--json", required=True, help="Write the figures to this JSON file.")
    p.add_argument("--clients", type=int, default=4, help="Concurrent writer processes.")
    p.add_argument("--records", type=int, default=60_000,
                   help="Records per side in total (split over the clients); enough that the "
                        "raw side runs for most of a second.")
    p.add_argument("--batch", type=int, default=256, help="Records per Publish / pipeline.")
    p.add_argument("--tokens", type=int, default=300, help="Tokens per ROLLOUT record.")
    p.add_argument("--redis-url", default=None,
                   help="Redis URL (default $REDIS_URL, else redis://127.0.0.1:6379/0).")
    p.add_argument("--workers", type=int, default=1,
                   help="SEE server worker processes (see serve --workers).")
    p.add_argument("--repeats", type=int, default=3,
                   help="Run both sides this many times, back to back; the median of the "
                        "paired ratios is reported.")

