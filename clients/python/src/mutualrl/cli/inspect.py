"""`mutualrl inspect runs|policies|records|record|transfers` (SEE REST) and
`mutualrl inspect allocation` (MWRA gRPC): look inside a running deployment."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from mutualrl.client.rest import follow_pages
from mutualrl.common.commands import Commands


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

    data = follow_pages(lambda cursor: _get(args, "/v1/runs", {"cursor": cursor}))
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

    path = f"/v1/runs/{urllib.parse.quote(args.run, safe='')}/stats"
    data = follow_pages(lambda cursor: _get(args, path, {"cursor": cursor}))
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


def _inspect(args: argparse.Namespace) -> int:
    import grpc
    from google.protobuf.json_format import MessageToDict
    from rich.console import Console
    from rich.table import Table

    from mutualrl.client.mwra import MwraClient
    from mutualrl.common.channel import INTERACTIVE_OUTAGE_BUDGET

    with MwraClient(args.addr, token=args.token, timeout=args.timeout,
                    outage_budget=INTERACTIVE_OUTAGE_BUDGET) as client:
        try:
            table = client.list_allocations(args.run)
        except grpc.RpcError as err:
            print(f"{args.addr}: {err.code().name}: {err.details()}", file=sys.stderr)
            return 1
    if args.json:
        print(json.dumps(MessageToDict(table, preserving_proto_field_name=True), indent=2))
        return 0
    console = Console()
    console.print(f"[bold]run {table.run_id}[/]  epoch {table.epoch}  round {table.round}  "
                  f"strategy {table.strategy or '-'}  pool {table.pool_units} units  "
                  f"idle {table.idle_units}  leader {table.leader or '-'}")
    allocs = {a.policy_id: a for a in table.allocations}
    pt = Table(title="policies")
    for col in ("policy", "trainer", "live", "active", "units", "threads", "budget", "workers",
                "rollout servers", "rollout workers (threads)", "cost (unit-s)",
                "rollout / update (unit-s)", "last step s", "reports"):
        pt.add_column(col)
    for p in table.policies:
        a = allocs[p.policy_id]
        split = (f"{p.smoothed_rollout_cost:.3f} / {p.smoothed_update_cost:.3f}"
                 if p.smoothed_rollout_cost or p.smoothed_update_cost else "-")
        pt.add_row(p.policy_id, p.trainer_id or "-", "yes" if p.live else "[red]no[/]",
                   "yes" if a.active else "no", str(a.units), str(a.threads),
                   str(a.rollout_budget),
                   ", ".join(f"{s.worker_id}:{s.units}" for s in a.slices) or "-",
                   ", ".join(a.rollout_addresses) or "-",
                   f"{a.rollout_workers} ({a.rollout_threads})" if a.rollout_workers else "-",
                   f"{p.smoothed_cost:.3f}" if p.reports else "-", split,
                   f"{p.last_seconds:.3f}" if p.reports else "-", str(p.reports))
    console.print(pt)
    wt = Table(title="workers")
    for col in ("worker", "state", "units", "cpu", "gpu", "rollout", "held by", "lease left s"):
        wt.add_column(col)
    now = time.time() * 1000
    for w in table.workers:
        cap = w.worker.capacity
        gpu = f"{cap.gpu_count} {cap.gpu_kind}".strip() if cap.gpu_count else "-"
        left = (w.lease.expires_unix_ms - now) / 1000
        wt.add_row(w.worker.worker_id, w.state if w.state == "live" else f"[red]{w.state}[/]",
                   str(w.units), str(cap.cpu_slots), gpu, w.worker.rollout_address or "-",
                   ", ".join(f"{p}:{u}" for p, u in sorted(w.units_by_policy.items())) or "-",
                   f"{left:.1f}")
    console.print(wt)
    return 0



def register(commands: Commands) -> None:
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

    p = commands.add(["inspect", "allocation"], "Show who holds which workers in a run "
                     "(MWRA ListAllocations).", _inspect)
    p.add_argument("--run", required=True, help="Run id.")
    p.add_argument("--addr", default="127.0.0.1:50053", help="MWRA host:port.")
    p.add_argument("--token", default=None, help="Bearer token (default MUTUALRL_AUTH_TOKEN).")
    p.add_argument("--timeout", type=float, default=10.0, help="Seconds per call.")
    p.add_argument("--json", action="store_true", help="Print the table as JSON.")

