"""`mutualrl mwra serve`."""

from __future__ import annotations

import argparse

from mutualrl.common.commands import Commands


def _flags(parser: argparse.ArgumentParser) -> None:
    from mutualrl.common.flags import add_model_flags
    from mutualrl.mwra.config import MwraConfig

    add_model_flags(parser, MwraConfig)


def _serve(args: argparse.Namespace) -> int:
    from mutualrl.common import event_loop
    from mutualrl.common.config import load_section
    from mutualrl.common.flags import flag_values
    from mutualrl.mwra.config import MwraConfig
    from mutualrl.mwra.server import serve

    cfg = load_section(args.config, "mwra", MwraConfig, **flag_values(args, MwraConfig))
    event_loop.run(serve(cfg), cfg.event_loop)
    return 0


def register(commands: Commands) -> None:
    p = commands.add(["mwra", "serve"], "Run the MWRA allocator (gRPC) from the run config's "
                     "`mwra:` section; every field is a flag, over the file and the "
                     "environment.", _serve, deferred=_flags)
    p.add_argument("--config", default=None, help="Run YAML (section `mwra:`); defaults apply "
                   "when omitted.")
