"""Entry point of the processes the experiment starts: `python -m mutualrl.experiment.child
train|sft ...` runs the trainer's own `mutualrl train` / `mutualrl sft` handlers (registered
by mutualrl.trainer.cli.main), without loading every other command module."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from mutualrl.common.commands import Commands


def main(argv: Sequence[str] | None = None) -> int:
    from mutualrl.trainer.cli.main import register

    parser = argparse.ArgumentParser(prog="mutualrl-experiment-child")
    parser.add_argument("--log-level", default="WARNING", help="Python logging level.")
    register(Commands(parser))
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
