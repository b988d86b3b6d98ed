"""`mutualrl export --run RUN --policy NAME [--round N] --out DIR` (mutualrl.trainer.runtime.
export)."""

from __future__ import annotations

import argparse
import json
import sys

from mutualrl.trainer.runtime.export import ExportError, export, find_checkpoint


def run(args: argparse.Namespace) -> int:
    try:
        ckpt = find_checkpoint(args.run, args.policy, args.round, args.output_dir)
        out = export(ckpt, args.out, overwrite=args.overwrite)
    except ExportError as e:
        print(f"mutualrl export: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"checkpoint": str(ckpt), "out": str(out)}, indent=2))
    return 0
