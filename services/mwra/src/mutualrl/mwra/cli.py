"""`mutualrl mwra serve` and `mutualrl bench mwra`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mutualrl.common.commands import Commands


def _serve(args: argparse.Namespace) -> int:
    from mutualrl.common import event_loop
    from mutualrl.common.config import load_section
    from mutualrl.mwra.config import MwraConfig
    from mutualrl.mwra.server import serve

    cfg = load_section(args.config, "mwra", MwraConfig, host=args.host, port=args.port,
                       redis_url=args.redis_url, strategy=args.strategy,
                       metrics_port=args.metrics_port, replica_id=args.replica_id)
    event_loop.run(serve(cfg), cfg.event_loop)
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
           "idle_fraction_static": report["static"]["idle_fraction"],
           "idle_fraction_balanced": report["balanced"]["idle_fraction"]}
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
