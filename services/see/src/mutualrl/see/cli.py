"""`mutualrl see serve`."""

from __future__ import annotations

import argparse
import os

from mutualrl.common.commands import Commands


def _serve(args: argparse.Namespace) -> int:
    from mutualrl.common import event_loop
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
    from mutualrl.see.store.durability import DurabilityError

    try:
        event_loop.run(serve(cfg), cfg.event_loop)
    except DurabilityError as err:
        import sys

        print(f"SEE refuses to start: {err}", file=sys.stderr)
        return 2
    finally:
        if made_dir is not None:
            import shutil

            shutil.rmtree(made_dir, ignore_errors=True)
    return 0


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
