"""`mutualrl mwra serve`, `mutualrl inspect allocation` and `mutualrl bench mwra`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from mutualrl.cli import Commands


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from mutualrl.common.config import load_section
    from mutualrl.mwra.config import MwraConfig
    from mutualrl.mwra.server import serve

    cfg = load_section(args.config, "mwra", MwraConfig, host=args.host, port=args.port,
                       redis_url=args.redis_url, strategy=args.strategy,
                       metrics_port=args.metrics_port, replica_id=args.replica_id)
    asyncio.run(serve(cfg))
    return 0


def _inspect(args: argparse.Namespace) -> int:
    import grpc
    from google.protobuf.json_format import MessageToDict
    from rich.console import Console
    from rich.table import Table

    from mutualrl.client.mwra import MwraClient

    with MwraClient(args.addr, token=args.token, timeout=args.timeout, retries=1) as client:
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
                "rollout servers", "cost (unit-s)", "last step s", "reports"):
        pt.add_column(col)
    for p in table.policies:
        a = allocs[p.policy_id]
        pt.add_row(p.policy_id, p.trainer_id or "-", "yes" if p.live else "[red]no[/]",
                   "yes" if a.active else "no", str(a.units), str(a.threads),
                   str(a.rollout_budget),
                   ", ".join(f"{s.worker_id}:{s.units}" for s in a.slices) or "-",
                   ", ".join(a.rollout_addresses) or "-",
                   f"{p.smoothed_cost:.3f}" if p.reports else "-",
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


def _bench(args: argparse.Namespace) -> int:
    from mutualrl.mwra.simulate import compare

    costs: dict[str, float] = {}
    for item in args.costs.split(","):
        name, _, value = item.partition("=")
        costs[name.strip()] = float(value)
    report = compare(costs, args.units, rounds=args.rounds, noise=args.noise, seed=args.seed,
                     smoothing=args.smoothing, hysteresis=args.hysteresis)
    noiseless = compare(costs, args.units, rounds=args.rounds, noise=0.0, seed=args.seed,
                        smoothing=args.smoothing, hysteresis=args.hysteresis)
    out = {"bench": "mwra", "noisy": report, "noise_free": noiseless,
           "makespan_ratio_balanced_over_static": report["makespan_ratio_balanced_over_static"],
           "idle_fraction_static": report["static"]["idle_fraction"],  # type: ignore[index]
           "idle_fraction_balanced": report["balanced"]["idle_fraction"]}  # type: ignore[index]
    text = json.dumps(out, indent=2)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    print(f"balanced/static makespan ratio {out['makespan_ratio_balanced_over_static']:.4f} "
          f"(noise-free {noiseless['makespan_ratio_balanced_over_static']:.4f}); idle fraction "
          f"static {out['idle_fraction_static']:.3f}, "
          f"balanced {out['idle_fraction_balanced']:.3f}")
    return 0


def register(commands: Commands) -> None:
    p = commands.add(["mwra", "serve"], "Run the MWRA allocator (gRPC) from the run config's "
                     "`mwra:` section.", _serve)
    p.add_argument("--config", default=None, help="Run YAML (section `mwra:`); defaults apply "
                   "when omitted.")
    p.add_argument("--host", default=None, help="Override mwra.host.")
    p.add_argument("--port", type=int, default=None, help="Override mwra.port (0 = any).")
    p.add_argument("--metrics-port", type=int, default=None, help="Override mwra.metrics_port.")
    p.add_argument("--redis-url", default=None, help="Override mwra.redis_url.")
    p.add_argument("--strategy", default=None, choices=["static", "balanced", "time-share"],
                   help="Override mwra.strategy.")
    p.add_argument("--replica-id", default=None, help="Override mwra.replica_id.")

    p = commands.add(["inspect", "allocation"], "Show who holds which workers in a run "
                     "(MWRA ListAllocations).", _inspect)
    p.add_argument("--run", required=True, help="Run id.")
    p.add_argument("--addr", default="127.0.0.1:50053", help="MWRA host:port.")
    p.add_argument("--token", default=None, help="Bearer token (default MUTUALRL_AUTH_TOKEN).")
    p.add_argument("--timeout", type=float, default=10.0, help="Seconds per call.")
    p.add_argument("--json", action="store_true", help="Print the table as JSON.")

    p = commands.add(["bench", "mwra"], "Simulated rounds: makespan of `balanced` against "
                     "`static` equal shares, and idle fractions.", _bench)
    p.add_argument("--json", default=None, help="Write the figures to this JSON file.")
    p.add_argument("--costs", default="slow=3,fast=1",
                   help="Per-policy cost (unit-seconds per round): name=cost,...")
    p.add_argument("--units", type=int, default=8, help="Units in the pool.")
    p.add_argument("--rounds", type=int, default=200, help="Rounds to simulate.")
    p.add_argument("--noise", type=float, default=0.2, help="Lognormal sigma of step times.")
    p.add_argument("--seed", type=int, default=0, help="Noise seed.")
    p.add_argument("--smoothing", type=float, default=0.3, help="EMA weight of the newest cost.")
    p.add_argument("--hysteresis", type=float, default=0.1, help="Relative gain needed to move.")
