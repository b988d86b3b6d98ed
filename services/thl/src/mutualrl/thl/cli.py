"""`mutualrl thl serve`."""

from __future__ import annotations

import argparse

from mutualrl.common.commands import Commands


def _flags(parser: argparse.ArgumentParser) -> None:
    from mutualrl.common.flags import add_model_flags
    from mutualrl.thl.config import ThlConfig

    add_model_flags(parser, ThlConfig)


def _serve(args: argparse.Namespace) -> int:
    from mutualrl.common import event_loop
    from mutualrl.common.config import load_section
    from mutualrl.common.flags import flag_values
    from mutualrl.thl.config import ThlConfig
    from mutualrl.thl.server import serve

    cfg = load_section(args.config, "thl", ThlConfig, **flag_values(args, ThlConfig))
    event_loop.run(serve(cfg), cfg.event_loop)
    return 0


def register(commands: Commands) -> None:
    p = commands.add(["thl", "serve"], "Run the THL gRPC service (section `thl:` of the config; "
                     "every field is a flag, over the file and the environment).", _serve,
                     deferred=_flags)
    p.add_argument("--config", default=None, help="Run YAML; its `thl:` section is read.")
