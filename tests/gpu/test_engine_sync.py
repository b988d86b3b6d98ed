"""On a CUDA machine with SGLang and/or vLLM: two rounds with each engine (its memory released
around each step), after which the weights it serves equal the trainer's, for a full and a
LoRA policy (merged), trained in mixed precision (float32 master, bf16 compute, the engine
synced in bf16). vLLM's behaviour log-probs then match the trainer's to bf16 precision.
Skipped without CUDA; each engine is skipped where its package is missing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # pragma: no cover - the CPU machines skip here
    pytest.skip("needs a CUDA device", allow_module_level=True)

# Parameters both engines keep under the HF names (q/k/v and gate/up are fused there).
CHECKED = ("model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
           "model.layers.0.self_attn.o_proj.weight", "model.layers.1.mlp.down_proj.weight",
           "model.norm.weight")
ENGINES = [pytest.param(name, marks=pytest.mark.skipif(importlib.util.find_spec(name) is None,
                                                       reason=f"{name} is not installed"))
           for name in ("sglang", "vllm")]


def _cfg(out: Path, engine: str, lora: bool):
    from mutualrl.trainer.config.run import TrainerConfig

    policy: dict = {"name": "A", "preset": "llama-char", "device": "cuda:0",
                    "dtype": "float32", "compute_dtype": "bfloat16", "rollout_engine": engine,
                    "sglang": {"mem_fraction_static": 0.3, "release_memory": True,
                               "engine_args": {"disable_cuda_graph": True}},
                    "vllm": {"gpu_memory_utilization": 0.3, "release_memory": True}}
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


def _served(engine: object, names: list[str]) -> dict[str, torch.Tensor]:
    got = engine.served_weights(names, rows=8)  # type: ignore[attr-defined]
    return {n: torch.as_tensor(v, dtype=torch.float32).cpu() for n, v in got.items()}


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("engine", ENGINES)
def test_two_rounds_then_the_engine_serves_the_trainers_weights(tmp_path: Path, engine: str,
                                                                lora: bool) -> None:
    from mutualrl.trainer.model.batch import completion_logprobs, pack
    from mutualrl.trainer.model.lora import sync_tensors
    from mutualrl.trainer.runtime.loop import train
    from mutualrl.trainer.runtime.session import build_session

    s = build_session(_cfg(tmp_path, engine, lora), "A", cache_dir=tmp_path / "presets")
    try:
        start = {n: t.detach().clone() for n, t in sync_tensors(s.model)}
        metrics = train(s)
        assert metrics["reward_mean"] >= 0
        released = s.engine.released if engine == "sglang" else s.engine.asleep
        assert not released  # the last sync took the memory back
        mine = dict(sync_tensors(s.model))  # LoRA: base + scale * B @ A; float32 master
        served = _served(s.engine, list(CHECKED))
        moved = 0
        for name in CHECKED:
            want = mine[name][:8].to(torch.bfloat16).float().cpu()  # synced in bf16
            assert torch.equal(served[name], want), name
            moved += not torch.equal(want, start[name][:8].to(torch.bfloat16).float().cpu())
        assert moved  # training changed what is served (the check is not vacuous)
        if engine == "vllm":
            out = s.engine.generate(["add:37+58=", "rev:3871="], n=2, max_new_tokens=8,
                                    seeds=[1, 2])
            flat = [x for row in out for x in row]
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                lp = completion_logprobs(s.model, pack(
                    [x.prompt_token_ids for x in flat], [x.token_ids for x in flat], 0,
                    torch.device("cuda:0")))
            diffs = [abs(a - float(lp[i, j])) for i, x in enumerate(flat)
                     for j, a in enumerate(x.logprobs)]
            assert max(diffs) < 0.1 and sum(diffs) / len(diffs) < 0.02, max(diffs)
    finally:
        if engine == "sglang":
            s.engine.engine.shutdown()
        else:
            s.engine.close()
        s.close()
