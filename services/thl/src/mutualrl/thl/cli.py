"""`mutualrl thl serve`."""

from __future__ import annotations

import argparse

from mutualrl.common.commands import Commands


def _serve(args: argparse.Namespace) -> int:
    from mutualrl.common import event_loop
    from mutualrl.common.config import load_section
    from mutualrl.thl.config import ThlConfig
    from mutualrl.thl.server import serve

    cfg = load_section(args.config, "thl", ThlConfig, host=args.host, port=args.port,
                       metrics_port=args.metrics_port, redis_url=args.redis_url)
    event_loop.run(serve(cfg), cfg.event_loop)
    return 0


def register(commands: Commands) -> None:
    p = commands.add(["thl", "serve"], "Run the THL gRPC service (section `thl:` of the config).",
                     _serve)
    p.add_argument("--config", default=None, help="Run YAML; its `thl:` section is read.")
    p.add_argument("--host", default=None, help="Override thl.host.")
    p.add_argument("--port", type=int, default=None, help="Override thl.port (default 50052).")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="Override thl.metrics_port (default 9102).")
    p.add_argument("--redis-url", default=None, help="Override thl.redis_url.")
