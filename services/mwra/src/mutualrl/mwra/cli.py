"""`mutualrl mwra serve`."""

from __future__ import annotations

import argparse

from mutualrl.common.commands import Commands
from mutualrl.mwra.allocation import STRATEGIES


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


def register(commands: Commands) -> None:
    p = commands.add(["mwra", "serve"], "Run the MWRA allocator (gRPC) from the run config's "
                     "`mwra:` section.", _serve)
    p.add_argument("--config", default=None, help="Run YAML (section `mwra:`); defaults apply "
                   "when omitted.")
    p.add_argument("--host", default=None, help="Override mwra.host.")
    p.add_argument("--port", type=int, default=None, help="Override mwra.port (0 = any).")
    p.add_argument("--metrics-port", type=int, default=None, help="Override mwra.metrics_port.")
    p.add_argument("--redis-url", default=None, help="Override mwra.redis_url.")
    p.add_argument("--strategy", default=None, choices=STRATEGIES,
                   help="Override mwra.strategy.")
    p.add_argument("--replica-id", default=None, help="Override mwra.replica_id.")
