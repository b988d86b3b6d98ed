"""The `mutualrl` command line: one entry point; each installed package adds its commands.

A package declares `[project.entry-points."mutualrl.commands"]` naming a function
`register(commands: mutualrl.common.commands.Commands)`, so `mutualrl --help` lists exactly
what is installed (the SDK alone has `version`, `health`, `inspect` and `thl register|list`).
Heavy imports happen inside handlers so `mutualrl --help` stays fast.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from importlib.metadata import entry_points

from mutualrl.common.commands import Commands, Handler

ENTRY_POINT_GROUP = "mutualrl.commands"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mutualrl",
        description="Mutual reinforcement learning: heterogeneous policies trained with GRPO "
        "that share experience through SEE, THL and MWRA.",
    )
    parser.add_argument("--log-level", default="INFO", help="Python logging level.")
    commands = Commands(parser)
    # Sorted by name so the help lists commands in the same order on every machine.
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        ep.load()(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # gRPC's fork handlers restart its poller in a child made by fork(); `subprocess` with a
    # preexec_fn (the supervisor's parent-death signal) forks, closes the fds (gRPC's epoll fd
    # among them) and the restarted poller aborts the child before it can exec. MutualRL never
    # uses a channel across fork() (SEE's workers are spawned), so fork support stays off unless
    # the user turns it on. It must be set before grpc is first imported.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    return int(handler(args) or 0)
