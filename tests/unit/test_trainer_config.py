"""Trainer configs: the shipped YAMLs load, every field is documented, bad input is refused."""

from pathlib import Path
from typing import get_args

import pytest
from pydantic import BaseModel, ValidationError

from mutualrl.trainer.config import TrainerConfig, load_trainer_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("name", ["demo.yaml", "trainer-local.yaml"])
def test_shipped_configs_load(name: str) -> None:
    cfg = load_trainer_config(CONFIGS / name)
    assert cfg.policy(cfg.policies[0].name).name == cfg.policies[0].name


def test_every_field_documented() -> None:
    def walk(model: type[BaseModel]) -> None:
        for fname, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{fname} has no description"
            for ann in (field.annotation, *get_args(field.annotation)):
                if isinstance(ann, type) and issubclass(ann, BaseModel):
                    walk(ann)

    walk(TrainerConfig)


def test_policy_selection_and_validation() -> None:
    cfg = TrainerConfig.model_validate(
        {"policies": [{"name": "A", "preset": "gpt2-bpe"}, {"name": "B", "preset": "llama-char"}]})
    assert cfg.policy("B").preset == "llama-char"
    with pytest.raises(ValueError, match="--policy"):
        cfg.policy(None)
    with pytest.raises(ValueError, match="no policy"):
        cfg.policy("C")
    with pytest.raises(ValidationError):  # neither preset nor model_path
        TrainerConfig.model_validate({"policies": [{"name": "A"}]})
    with pytest.raises(ValidationError):  # unknown knob
        TrainerConfig.model_validate({"grpo": {"G": 8}, "policies": [{"name": "A",
                                                                       "preset": "x"}]})
