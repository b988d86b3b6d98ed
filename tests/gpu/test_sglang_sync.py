"""On a CUDA machine with sglang: two rounds with the SGLang engine (memory released around
each step), after which the weights SGLang serves equal the trainer's, for a full and a LoRA
policy (merged). Skipped without CUDA or sglang."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("sglang")
if not torch.cuda.is_available():  # pragma: no cover - the CPU machines skip here
    pytest.skip("needs a CUDA device", allow_module_level=True)

# Parameters SGLang keeps under their HF names (q/k/v and gate/up are fused there).
CHECKED = ("model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
           "model.layers.0.self_attn.o_proj.weight", "model.layers.1.mlp.down_proj.weight",
           "model.norm.weight")


def _cfg(out: Path, lora: bool):
    from mutualrl.trainer.config import TrainerConfig

    policy: dict = {"name": "A", "preset": "llama-char", "device": "cuda:0",
                    "dtype": "bfloat16", "rollout_engine": "sglang",
                    "sglang": {"mem_fraction_static": 0.3, "release_memory": True,
                               "engine_args": {"disable_cuda_graph": True}}}
    if lora:
        policy["lora"] = {"rank": 4, "alpha": 8,
                          "target_modules": ["o_proj", "down_proj", "q_proj"]}
    return TrainerConfig.model_validate({
        "run_id": "gpu", "output_dir": str(out), "services": {"local": True},
        "grpo": {"group_size": 4, "prompts_per_round": 4, "rounds": 2, "lr": 1e-2,
                 "max_new_tokens": 12},
        "task": {"format_reward": 0.5},
        "eval": {"every": 0}, "checkpoint": {"every": 1, "keep": 1},
        "metrics": {"tensorboard": False, "progress": False},
        "policies": [policy]})


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_two_rounds_then_sglang_serves_the_trainers_weights(tmp_path: Path, lora: bool) -> None:
    from mutualrl.trainer.loop import train
    from mutualrl.trainer.rollout import sync_tensors
    from mutualrl.trainer.session import build_session

    s = build_session(_cfg(tmp_path, lora), "A", cache_dir=tmp_path / "presets")
    try:
        start = {n: t.detach().clone() for n, t in sync_tensors(s.model)}
        metrics = train(s)
        assert metrics["reward_mean"] >= 0
        assert not s.engine.released  # the last sync took the memory back
        mine = dict(sync_tensors(s.model))  # LoRA: base + scale * B @ A
        served = s.engine.served_weights(list(CHECKED), rows=8)
        moved = 0
        for name in CHECKED:
            want = mine[name][:8].float().cpu()
            got = torch.tensor(served[name], dtype=torch.float32)
            assert torch.equal(got, want), name
            moved += not torch.equal(want, start[name][:8].float().cpu())
        assert moved  # training changed what is served (the check is not vacuous)
    finally:
        s.engine.engine.shutdown()
        s.close()
