"""Mixed precision: float32 master weights and AdamW state with bf16 compute train at RL
learning rates; bf16 master weights do not, and the config refuses them, naming the fields."""

from __future__ import annotations

import pytest
import torch
from tiny_round import PAD, fixed_round, tiny_model

from mutualrl.trainer.config.run import GRPOSettings, ProbeSettings, TrainerConfig
from mutualrl.trainer.runtime.session import compute_dtype
from mutualrl.trainer.runtime.step import StepSettings, optimise
from mutualrl.trainer.sharing.probes import make_probe

torch.set_num_threads(1)


def _scaled_tiny(dtype: torch.dtype) -> torch.nn.Module:
    """The tiny Llama with weights of the size real checkpoints have (N(0, 0.02))."""
    model = tiny_model()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(hash(name) % 2**31))
    return model.to(dtype)


def _changed_share(param_dtype: torch.dtype, compute: torch.dtype | None, lr: float,
                   steps: int = 3) -> tuple[float, torch.nn.Module]:
    """Share of the weights with a gradient that a few optimiser steps changed."""
    model = _scaled_tiny(param_dtype)
    model.train()
    prompt_ids, data = fixed_round()
    plan = make_probe(ProbeSettings(kind="none"), "A", None).plan(data)
    grpo = GRPOSettings(lr=lr)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    touched = {n: torch.zeros_like(p, dtype=torch.bool) for n, p in model.named_parameters()}
    for _ in range(steps):
        optimise(model, None, opt, prompt_ids, data, plan,
                 StepSettings.of(grpo, ProbeSettings(), PAD, 8, compute=compute))
        for n, p in model.named_parameters():
            if p.grad is not None:
                touched[n] |= p.grad != 0
    changed = total = 0
    for n, p in model.named_parameters():
        mask = touched[n]
        changed += int(((p.detach() != before[n]) & mask).sum())
        total += int(mask.sum())
    assert total > 0
    return changed / total, model


def test_fp32_master_with_bf16_compute_trains_at_lr_1e6() -> None:
    share, model = _changed_share(torch.float32, torch.bfloat16, 1e-6)
    assert share >= 0.99, share
    # The master weights and the optimizer's moments stayed float32.
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_bf16_master_weights_lose_the_steps() -> None:
    """Today's bf16-parameter path: at lr 1e-6 most updates round away."""
    share, _ = _changed_share(torch.bfloat16, None, 1e-6)
    assert share < 0.5, share


def test_bf16_compute_runs_forward_in_bf16() -> None:
    """The autocast is real: bf16 compute gives other logits than float32 compute."""
    model = _scaled_tiny(torch.float32)
    ids = torch.tensor([[1, 5, 6, 7, 8, 9]])
    with torch.no_grad():
        full = model(input_ids=ids).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = model(input_ids=ids).logits
    assert half.dtype == torch.bfloat16
    assert not torch.equal(full, half.float())


def _cfg(policy: dict[str, object], lr: float = 1e-6) -> TrainerConfig:
    return TrainerConfig.model_validate({
        "grpo": {"lr": lr}, "policies": [{"name": "a", "preset": "llama-char", **policy}]})


def test_config_refuses_bf16_master_at_small_lr_naming_fields() -> None:
    with pytest.raises(ValueError, match=r"policies\[0\] \(a\)\.dtype with grpo\.lr.*"
                                         r"compute_dtype: bfloat16"):
        _cfg({"dtype": "bfloat16"})
    with pytest.raises(ValueError, match=r"policies\[0\]\.grpo\.lr"):
        _cfg({"dtype": "bfloat16", "grpo": {"lr": 1e-7}}, lr=1e-3)
    # A large enough lr is a choice bf16 can hold; float32 masters are always accepted.
    assert _cfg({"dtype": "bfloat16"}, lr=1e-3).policies[0].dtype == "bfloat16"
    cfg = _cfg({"dtype": "float32", "compute_dtype": "bfloat16"})
    assert compute_dtype(cfg.policies[0]) is torch.bfloat16
    assert compute_dtype(_cfg({}).policies[0]) is None
    with pytest.raises(ValueError, match="compute_dtype"):
        _cfg({"compute_dtype": "float16"})
