"""The run file README.md and docs/getting-started.md show for training one's own checkpoints
is a valid trainer section, so the example cannot drift from the schema."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from mutualrl.trainer.config.run import TrainerConfig
from mutualrl.trainer.config.task import DatasetTaskConfig

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_the_two_checkpoint_example_is_a_valid_run_file(page: str) -> None:
    text = (ROOT / page).read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "model_path" in b]
    assert len(blocks) == 1, f"{page} should show one run file with checkpoints"
    cfg = TrainerConfig.model_validate(yaml.safe_load(blocks[0])["trainer"])
    assert isinstance(cfg.task, DatasetTaskConfig)
    assert [r.fn for r in cfg.task.rewards] == ["math_verify", "my_rewards.py:concise"]
    assert cfg.task.success_reward == "math_verify"
    assert len(cfg.eval.benchmarks) == 1 and cfg.eval.benchmarks[0].n == 8
    assert len(cfg.policies) == 2
    assert all(p.model_path is not None and p.preset is None for p in cfg.policies)
    assert cfg.probe.kind == "sgt"
    # YAML reads `\b` in a double-quoted string as a backspace: the prompt must say \boxed{}.
    assert cfg.task.system is not None and r"\boxed{}" in cfg.task.system
    assert not any(ord(ch) < 32 for ch in cfg.task.system), repr(cfg.task.system)
