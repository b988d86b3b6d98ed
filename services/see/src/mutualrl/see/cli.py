"""`mutualrl see serve`."""

from __future__ import annotations

import argparse
import os

from mutualrl.common.commands import Commands
from mutualrl.common.flags import deferred_flags


def _serve(args: argparse.Namespace) -> int:
    from mutualrl.common import event_loop
    from mutualrl.common.flags import load_flagged
    from mutualrl.see.config import SeeConfig

    cfg = load_flagged(args, "see", SeeConfig)
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
                     "inspection API, backed by Redis; every `see:` field is a flag, over the "
                     "config file and the environment.", _serve,
                     deferred=deferred_flags("mutualrl.see.config", "SeeConfig"))
    p.add_argument("--config", default=None, help="Run YAML; its `see:` section configures SEE.")
