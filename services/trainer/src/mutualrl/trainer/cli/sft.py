"""`mutualrl sft -c FILE [--<field> ...]`: one warm start (mutualrl.trainer.runtime.sft)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pydantic import ValidationError

from mutualrl.common.config import deep_merge, load_yaml
from mutualrl.common.flags import flag_values
from mutualrl.trainer.config.run import first_error
from mutualrl.trainer.config.sft import SFTConfig
from mutualrl.trainer.runtime.sft import EVAL_FILE, run_sft


def run(args: argparse.Namespace) -> int:
    data: dict[str, Any] = {}
    if args.config:
        raw = load_yaml(args.config)
        # Either a dedicated SFT file or an `sft:` section of a run YAML.
        data = dict(raw.get("sft", raw))
    flags = flag_values(args, SFTConfig)
    if "model_path" in flags:
        data["preset"] = None  # a model path replaces the default preset
    try:
        cfg = SFTConfig.model_validate(deep_merge(data, flags))
    except ValidationError as err:
        print(f"mutualrl sft: {first_error(err)}", file=sys.stderr)
        return 2
    out = run_sft(cfg)
    report = json.loads((out / EVAL_FILE).read_text())
    print(json.dumps({"checkpoint": str(out), "heldout_accuracy": report["heldout_accuracy"],
                      "train_seconds": report["train_seconds"]}, indent=2))
    return 0
