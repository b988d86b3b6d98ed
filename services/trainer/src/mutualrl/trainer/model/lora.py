"""LoRA policies through peft: wrap a model, use its base as the reference, merge for serving.

With `PolicySettings.lora` set, only the adapters train (and are checkpointed, as peft's
adapter directory). The reference policy of the KL term and of the KL-to-start diagnostic is
the same module with its adapters disabled: the frozen base weights *are* the starting policy,
so no second copy is loaded. A rollout engine with its own copy of the weights (SGLang) gets
the merged weights W + scale * B @ A under the base model's parameter names.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

import torch
from transformers import PreTrainedModel

from mutualrl.trainer.config.run import LoraSettings

if TYPE_CHECKING:  # peft is imported when a policy has adapters (it takes seconds)
    from peft import PeftModel


def is_lora(model: torch.nn.Module) -> bool:
    """Whether `model` is a peft model (only its adapters are trained and saved)."""
    return hasattr(model, "peft_config")


def wrap(model: PreTrainedModel, settings: LoraSettings) -> PreTrainedModel:
    """`model` with fresh LoRA adapters (B = 0, so it computes exactly what `model` did);
    every base parameter frozen. The result is a peft model, which answers to the wrapped
    model's interface (forward, config, save_pretrained)."""
    from peft import LoraConfig, TaskType, get_peft_model

    cfg = LoraConfig(task_type=TaskType.CAUSAL_LM, r=settings.rank, lora_alpha=settings.alpha,
                     lora_dropout=settings.dropout, target_modules=settings.target_modules)
    # A PeftModel forwards every attribute to the model it wraps.
    return cast(PreTrainedModel, get_peft_model(model, cfg))


@contextmanager
def base_mode(policy: PeftModel) -> Iterator[None]:
    """The peft `policy` computes its base: adapters disabled, eval mode (mode restored)."""
    was_training = policy.training
    policy.eval()
    try:
        with policy.disable_adapter():
            yield
    finally:
        policy.train(was_training)


class _InBaseMode(torch.nn.Module):
    """`inner` (a part of `policy`) called with the policy in base mode; owns no parameters."""

    policy: PeftModel
    inner: torch.nn.Module

    def __init__(self, policy: PeftModel, inner: torch.nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "policy", policy)
        object.__setattr__(self, "inner", inner)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with base_mode(self.policy):
            return self.inner(*args, **kwargs)


class BaseReference(_InBaseMode):
    """The base of a peft model as a frozen reference: calls run with the adapters disabled
    and in eval mode. It holds the policy without registering it, so it owns no parameters
    (`.parameters()` is empty) and copies nothing; other attributes read through to it.

    Its decoder (`get_decoder`, what a chunked LM-head pass runs the body through) runs in base
    mode too; the output head is the policy's own, which a LoRA on `lm_head` would turn into a
    peft layer that callers do not split off (they run the whole reference instead).
    """

    def __init__(self, model: PreTrainedModel) -> None:  # a model `wrap` gave adapters
        super().__init__(cast("PeftModel", model), model)

    def get_decoder(self) -> torch.nn.Module:
        return _InBaseMode(self.policy, self.policy.get_decoder())

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["policy"], name)


def merged_named_tensors(model: PeftModel) -> list[tuple[str, torch.Tensor]]:
    """The base model's parameters under its own names, each LoRA-adapted weight replaced by
    W + scale * B @ A of the active adapter (what `merge_and_unload` would hold), computed
    without touching the trained module."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    active = model.active_adapter
    layers = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    out: list[tuple[str, torch.Tensor]] = []
    with torch.no_grad():
        for name, p in base.named_parameters():
            if ".lora_" in name:
                continue
            owner, _, leaf = name.rpartition(".base_layer.")
            if owner and owner in layers:
                t = p.detach()
                layer: Any = layers[owner]  # each LoRA layer type defines get_delta_weight
                if leaf == "weight" and active in layer.lora_A and not layer.merged:
                    t = t + layer.get_delta_weight(active).to(t.dtype)
                out.append((f"{owner}.{leaf}", t))
            else:
                out.append((name, p.detach()))
    return out


def sync_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of what an engine serving the base model's architecture must load."""
    if is_lora(model):
        return merged_named_tensors(cast("PeftModel", model))
    return [(name, p.detach()) for name, p in model.named_parameters()]
