"""The smallest `mutualrl up` run file: two tiny policies of two families under SGT, shared by
the e2e tests that launch `mutualrl up` as a user would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def up_config(tmp_path: Path, run_id: str, rounds: int,
              deadline_seconds: float = 2.0) -> dict[str, Any]:
    """GPT-2 + byte BPE and Llama + chars, 4 prompts x 4 samples of 6 new tokens a round."""
    return {
        "up": {"restart": "never", "health_timeout": 120, "stop_grace": 60, "status_every": 0.5},
        "trainer": {
            "run_id": run_id,
            "output_dir": str(tmp_path / "runs"),
            "task": {"regime": "short", "skills": ["add", "rev"], "heldout_per_skill": 8},
            "grpo": {"group_size": 4, "prompts_per_round": 4, "rounds": rounds,
                     "max_new_tokens": 6},
            "probe": {"kind": "sgt", "deadline_seconds": deadline_seconds},
            "eval": {"every": 0},
            "checkpoint": {"every": 1000},
            "metrics": {"tensorboard": False},
            "policies": [{"name": "gpt2-bpe", "preset": "gpt2-bpe"},
                         {"name": "llama-char", "preset": "llama-char"}],
        },
    }


def write_yaml(path: Path, cfg: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(cfg))
    return path
