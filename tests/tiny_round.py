"""One tiny Llama and one fixed GRPO round, shared by the trainer-step and LoRA tests."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mutualrl.trainer.data.tasks import Prompt
from mutualrl.trainer.sharing.probes import RoundData

PAD = 0


@dataclass
class FakeSample:
    token_ids: list[int]
    text: str = ""
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"


def tiny_model(seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=24, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      pad_token_id=PAD, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg)


def fixed_round() -> tuple[list[list[int]], RoundData]:
    """Two prompts x four samples of varying length, rewards with variance in both groups."""
    prompt_ids = [[1, 5, 6, 7], [1, 8, 9]]
    completions = [
        [[10, 11, 2], [12, 2], [10, 13, 14, 2], [15]],
        [[16, 2], [17, 18, 2], [16, 19], [20, 21, 22, 2]],
    ]
    samples = [[FakeSample(c) for c in row] for row in completions]
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
    prompts = [Prompt(id=f"p{i}", skill="add", text=f"p{i}", answer="") for i in range(2)]
    return prompt_ids, RoundData(round=0, prompts=prompts, samples=samples, rewards=rewards)
