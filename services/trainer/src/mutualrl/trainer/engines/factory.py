"""The engine a policy's `rollout_engine` names, built over its model."""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerFast

from mutualrl.trainer.engines.base import ENGINES, RolloutEngine
from mutualrl.trainer.engines.hf import HFEngine
from mutualrl.trainer.engines.sglang import SGLangEngine
from mutualrl.trainer.engines.vllm import VLLMEngine


def make_engine(name: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast,
                model_path: str | None = None,
                **kwargs: Any) -> RolloutEngine:
    """Engine `name` ("hf", "sglang" or "vllm") over `model`, with the engine's own keyword
    arguments; sglang and vllm also need the model directory (they load it once, then take
    weight syncs)."""
    if name == "hf":
        return HFEngine(model, tokenizer, **kwargs)
    path = model_path or getattr(getattr(model, "config", None), "_name_or_path", None)
    if name in ("sglang", "vllm") and not path:
        raise ValueError(f"the {name} engine needs model_path (a saved model directory)")
    if name == "sglang":
        return SGLangEngine(str(path), tokenizer, **kwargs)
    if name == "vllm":
        return VLLMEngine(str(path), tokenizer, **kwargs)
    raise ValueError(f"unknown rollout engine {name!r}; expected one of {ENGINES}")
