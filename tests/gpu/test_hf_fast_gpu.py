"""On a CUDA machine: the HF engine's fast path as a trainer sets it up (float32 master, bf16
compute: a bf16 copy synced after each optimizer step, the decode step replayed as CUDA
graphs). Its behaviour log-probs match the trainer's teacher-forced ones at bf16 precision
(float32 sampling: to 1e-3); the graphs replay (counted) the computation the same step runs
eagerly in the same shapes, bit for bit; a sync after an optimizer step changes what is
sampled; `bench rollout --device cuda` writes its figures; and the memory the engine holds
is what the memory plan counts for it. Skipped without CUDA."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

if not torch.cuda.is_available():  # pragma: no cover - the CPU machines skip here
    pytest.skip("needs a CUDA device", allow_module_level=True)

PROMPTS = ["add:37+58=", "rev:3871=", "sort:5193=", "s:1=", "add:5+5="]
SEEDS = [3, 1, 4, 1, 5]


def _session(tmp: Path, preset: str = "llama-char", lr: float = 1e-2, **grpo: Any) -> Any:
    from mutualrl.trainer.config.run import TrainerConfig
    from mutualrl.trainer.runtime.session import build_session

    cfg = TrainerConfig.model_validate({
        "run_id": "gpu-fast", "output_dir": str(tmp), "services": {"local": True},
        "grpo": {"group_size": 4, "prompts_per_round": 4, "rounds": 2, "lr": lr,
                 "max_new_tokens": 16, **grpo},
        "task": {"format_reward": 0.5}, "eval": {"every": 0}, "checkpoint": {"every": 0},
        "metrics": {"tensorboard": False, "progress": False},
        "policies": [{"name": "A", "preset": preset, "device": "cuda:0", "dtype": "float32",
                      "compute_dtype": "bfloat16"}]})
    return build_session(cfg, "A", cache_dir=tmp / "presets")


def _diffs(model: Any, samples: list[Any], pad: int, autocast: bool) -> list[float]:
    from mutualrl.trainer.model.batch import completion_logprobs, pack

    batch = pack([s.prompt_token_ids for s in samples], [s.token_ids for s in samples], pad,
                 torch.device("cuda:0"))
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if autocast else torch.no_grad()
    with torch.no_grad(), ctx:
        lp = completion_logprobs(model, batch, 1.0)
    return [abs(a - float(lp[i, j])) for i, s in enumerate(samples)
            for j, a in enumerate(s.logprobs)]


def test_the_trainers_engine_is_the_fast_path_on_a_bf16_copy_with_graphs(tmp_path: Path) -> None:
    from mutualrl.trainer.engines.hf import HFEngine

    s = _session(tmp_path)
    try:
        eng = s.engine
        assert isinstance(eng, HFEngine) and eng.decoder is not None and eng.decoder.graphs
        assert eng.weights == "copy"
        assert next(eng._sampler().parameters()).dtype == torch.bfloat16
        samples = [x for row in eng.generate(PROMPTS, 4, 16, seeds=SEEDS) for x in row]
        d = _diffs(s.model, samples, s.tokenizer.pad_token_id, autocast=True)
        assert max(d) < 0.1 and sum(d) / len(d) < 0.02, max(d)
        # Sampling from the float32 master (no copy): the trainer's float32 log-probs.
        fp32 = HFEngine(s.model, s.tokenizer)
        samples = [x for row in fp32.generate(PROMPTS, 4, 16, seeds=SEEDS) for x in row]
        assert max(_diffs(s.model, samples, s.tokenizer.pad_token_id, autocast=False)) < 1e-3
    finally:
        s.close()


def test_the_decode_graphs_replay_the_eager_step_bit_for_bit(tmp_path: Path) -> None:
    from mutualrl.trainer.engines.hf import HFEngine
    from mutualrl.trainer.runtime.presets import ensure_preset, load_policy

    model, tok = load_policy(ensure_preset("llama-char", tmp_path), device="cuda:0")
    graphs = HFEngine(model, tok, cuda_graphs=True, window_tokens=8, stop_check_every=4)
    eager = HFEngine(model, tok, cuda_graphs=True, window_tokens=8, stop_check_every=4)
    eager.decoder.graphs = False  # the same shapes, run eagerly
    a = [x for row in graphs.generate(PROMPTS, 4, 24, seeds=SEEDS) for x in row]
    first = graphs.stats()
    assert first["graph_captures"] >= 1 and first["graph_replays"] >= 1
    assert first["eager_steps"] == 0
    b = [x for row in eager.generate(PROMPTS, 4, 24, seeds=SEEDS) for x in row]
    assert eager.stats()["graph_replays"] == 0
    assert eager.stats()["eager_steps"] == first["graph_replays"]
    for x, y in zip(a, b, strict=True):
        assert (x.token_ids, x.logprobs, x.finish_reason) == (y.token_ids, y.logprobs,
                                                              y.finish_reason)
    # The next round of the same shape replays the graphs it has: none is captured again.
    graphs.generate(PROMPTS, 4, 24, seeds=[s + 1 for s in SEEDS])
    again = graphs.stats()
    assert again["graph_captures"] == first["graph_captures"]
    assert again["graph_replays"] > first["graph_replays"]
    assert again["pool_allocations"] == 1


def test_a_sync_after_an_optimizer_step_changes_what_is_sampled(tmp_path: Path) -> None:
    from mutualrl.trainer.runtime.loop import run_round

    s = _session(tmp_path, lr=5e-2)
    try:
        def ids() -> list[list[int]]:
            return [x.token_ids for row in s.engine.generate(PROMPTS, 4, 16, seeds=SEEDS)
                    for x in row]

        before = ids()
        assert ids() == before  # the same weights and seeds: the same samples
        run_round(s, 0)  # an optimizer step, then the engine's sync
        copy = dict(s.engine._sampler().named_parameters())
        for name, p in s.model.named_parameters():
            assert torch.equal(copy[name], p.detach().to(torch.bfloat16)), name
        assert ids() != before
    finally:
        s.close()


def test_bench_rollout_on_cuda_writes_its_figures(tmp_path: Path) -> None:
    from mutualrl.bench.rollout import run_bench

    out = run_bench(prompts=4, group=4, new_tokens=16, repeats=1, cache_dir=tmp_path,
                    device="cuda", shape="tiny", engines=["hf_loop", "hf", "generate"])
    for name in ("hf_loop", "hf", "generate"):
        assert out[f"{name}_tokens_per_s"] > 0 and out[f"{name}_peak_alloc_gib"] > 0
        assert 0 < out[f"{name}_share_of_bound"] < 1
    assert out["hf_graph_captures"] >= 1 and out["hf_graph_replays"] >= 1
    assert out["hf_capture_s"] > 0 and out["bound_tokens_per_s"] > 0
    assert out["ratio"] > 0 and out["ratio_hf_over_generate"] > 0


def test_the_plan_counts_what_the_fast_path_holds(tmp_path: Path) -> None:
    """The engine's copy and static cache (allocated) and its graphs' pool (reserved) against
    the plan's `sampling_copy`, `kv_cache` and `sampler` for the same round."""
    from mutualrl.trainer.runtime.memory import model_shape, policy_plan
    from mutualrl.trainer.runtime.presets import ensure_preset

    s = _session(tmp_path, preset="llama-10m", prompts_per_round=8, group_size=8,
                 max_new_tokens=96)
    try:
        torch.cuda.synchronize()
        alloc0, reserved0 = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        eng = s.engine
        # The copy exists since the session was built: measure the rest from here.
        rows = s.render(s.task.round_prompts(0, 8, 0))
        eng.generate(rows, 8, 96, seeds=list(range(8)))
        torch.cuda.synchronize()
        alloc = torch.cuda.memory_allocated() - alloc0
        reserved = torch.cuda.memory_reserved() - reserved0
        longest = max(len(r) for r in rows)
        path = ensure_preset("llama-10m", tmp_path / "presets")
        x, p = policy_plan(model_shape(path), s.cfg, s.policy, longest,
                           torch.cuda.get_device_properties(0).total_memory)
        assert x.hf_weights == "copy" and x.hf_graphs
        copy = sum(q.numel() * q.element_size() for q in eng._sampler().parameters())
        assert abs(copy - p.items["sampling_copy"]) <= 0.01 * copy
        assert eng.decoder.pool.nbytes >= p.items["kv_cache"] * 0.9
        assert alloc <= 1.1 * eng.decoder.pool.nbytes + 8 * 2**20
        assert reserved <= 1.1 * (p.items["kv_cache"] + p.items["sampler"]) + 64 * 2**20, (
            reserved, p.items)
    finally:
        s.close()
