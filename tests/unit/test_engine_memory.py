"""The SGLang engine's memory hand-over around a step, without a GPU: the loop releases the
engine's memory after the rollouts and the weight sync takes it back (weights, the update, then
the KV cache), with merged LoRA weights under the base model's names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from mutualrl.trainer.config.run import LoraSettings
from mutualrl.trainer.engines.hf import HFEngine
from mutualrl.trainer.engines.sglang import SGLangEngine
from mutualrl.trainer.model import lora


class EngineCalls:
    """Stands in for `sglang.Engine` (not installable here): records the memory and weight
    calls `SGLangEngine` makes, with the signatures sglang 0.5 has."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.calls.append(("release", tags))

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self.calls.append(("resume", tags))

    def update_weights_from_tensor(self, named_tensors: list[tuple[str, Any]],
                                   flush_cache: bool = True) -> None:
        self.calls.append(("update", [n for n, _ in named_tensors]))


def _engine(releases: bool) -> tuple[SGLangEngine, EngineCalls]:
    eng = object.__new__(SGLangEngine)  # no sglang here: the wrapper around its Engine only
    rec = EngineCalls()
    eng.engine, eng.releases, eng.released, eng.tokenizer = rec, releases, False, None
    return eng, rec


def _tiny() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=24, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=1, num_attention_heads=4,
                                        num_key_value_heads=2, tie_word_embeddings=True))


@pytest.mark.parametrize("use_lora", [False, True])
def test_sync_resumes_weights_then_updates_then_kv_cache(use_lora: bool) -> None:
    model = _tiny()
    names = [n for n, _ in model.named_parameters()]
    if use_lora:
        model = lora.wrap(model, LoraSettings(rank=2, target_modules=["q_proj"]))
    eng, rec = _engine(releases=True)
    eng.release_memory()
    eng.release_memory()  # once only
    eng.sync_weights(model)
    assert rec.calls == [("release", ["weights", "kv_cache"]), ("resume", ["weights"]),
                         ("update", names), ("resume", ["kv_cache"])]
    assert not eng.released
    rec.calls.clear()
    eng.sync_weights(model)  # not released: a plain update
    assert rec.calls == [("update", names)]


def test_without_release_the_engine_keeps_its_memory() -> None:
    eng, rec = _engine(releases=False)
    eng.release_memory()
    eng.sync_weights(_tiny())
    assert [c[0] for c in rec.calls] == ["update"]


class OrderedHF(HFEngine):
    """The HF engine, recording when the loop samples, releases and syncs."""

    events: list[str]

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        self.events.append("generate")
        return super().generate(*args, **kwargs)

    def release_memory(self) -> None:
        self.events.append("release")

    def sync_weights(self, model: Any) -> None:
        self.events.append("sync")
        super().sync_weights(model)


def test_the_loop_releases_after_rollouts_and_syncs_after_the_step(tmp_path: Path) -> None:
    from mutualrl.trainer.config.run import TrainerConfig
    from mutualrl.trainer.runtime.loop import run_round
    from mutualrl.trainer.runtime.session import build_session

    cfg = TrainerConfig.model_validate({
        "run_id": "mem", "output_dir": str(tmp_path), "services": {"local": True},
        "grpo": {"group_size": 4, "prompts_per_round": 4, "rounds": 1, "max_new_tokens": 12},
        "task": {"format_reward": 0.5},
        "eval": {"every": 0}, "checkpoint": {"every": 0},
        "metrics": {"tensorboard": False, "progress": False},
        "policies": [{"name": "A", "preset": "llama-char"}]})
    s = build_session(cfg, "A", cache_dir=tmp_path / "presets")
    eng = OrderedHF(s.model, s.tokenizer)
    eng.events = []
    s.engine = eng
    before = [p.detach().clone() for p in s.model.parameters()]
    run_round(s, 0)
    s.close()
    assert eng.events == ["generate", "release", "sync"]
    assert any(not torch.equal(a, b) for a, b in zip(before, s.model.parameters(), strict=True))
