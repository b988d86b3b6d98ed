"""The trainer's loss against TRL 1.16's `GRPOTrainer` in float64: every aggregation (TRL's
`grpo`, `bnpo`, `dapo`, `dr_grpo`), GSPO (`importance_sampling_level="sequence"`), the k3 KL,
the entropy bonus, and `scale_rewards: none`. Ours takes the k3 KL as it is, so TRL's
`use_bias_correction_kl` (the KL times the ratio, on by default in 1.16) is off.

TRL samples and scores one round itself (`_generate_and_score_completions`), so the
completions, their padding and the advantages are TRL's. TRL's own log-probs come out of its
fused LM head in float32, so both sides are handed the same float64 log-probs and entropies of
`batch.completion_logprobs_and_entropy`: what is compared is the loss given the log-probs, and
its gradient. Ours is the training path (`step.accumulate`), micro-batched.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from mutualrl.trainer.algos.loss import group_advantages
from mutualrl.trainer.config.run import GRPOSettings, ProbeSettings
from mutualrl.trainer.model.batch import Batch, completion_logprobs_and_entropy, pack
from mutualrl.trainer.runtime.step import Rows, StepSettings, accumulate

trl = pytest.importorskip("trl")

torch.set_num_threads(1)
PAD, G, MAX_LEN = 0, 4, 8
PROMPTS = ["t5 t6"] * G + ["t7 t8 t9"] * G
TRL_AGGREGATION = {"grpo": "sequence_mean", "bnpo": "token_mean", "dapo": "token_mean",
                   "dr_grpo": "constant_length"}


@dataclass
class Round:
    trainer: Any
    inputs: dict[str, Any]
    rewards: list[float]
    batch: Batch
    rows: Rows


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(24)}, unk_token="t3"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="t0", bos_token="t1",
                                   eos_token="t2", unk_token="t3")


@pytest.fixture(scope="module")
def trl_round(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Round]:
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=24, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        pad_token_id=PAD, tie_word_embeddings=True)).to(torch.float64)
    rewards: list[float] = []

    def reward(completions: list[str], **_: Any) -> list[float]:
        out = [float(len(c) % 3) / 2 for c in completions]
        rewards.extend(out)
        return out

    out_dir: Path = tmp_path_factory.mktemp("trl")
    args = trl.GRPOConfig(
        output_dir=str(out_dir), use_cpu=True, report_to="none", save_strategy="no",
        logging_strategy="no", per_device_train_batch_size=len(PROMPTS), num_generations=G,
        max_completion_length=MAX_LEN, temperature=1.0, beta=0.0, epsilon=0.2,
        epsilon_high=0.28, scale_rewards="none", use_bias_correction_kl=False, bf16=False,
        gradient_checkpointing=False,
        disable_dropout=True, dataloader_num_workers=0, seed=0)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=[reward], args=args,
                              processing_class=_tokenizer(),
                              train_dataset=Dataset.from_dict({"prompt": PROMPTS}))
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop; one step here
    inputs = trainer._generate_and_score_completions([{"prompt": p} for p in PROMPTS])
    cmask = inputs["completion_mask"].bool()
    prompts = [ids[m].tolist() for ids, m in zip(inputs["prompt_ids"],
                                                  inputs["prompt_mask"].bool(), strict=True)]
    completions = [ids[m].tolist() for ids, m in zip(inputs["completion_ids"], cmask,
                                                      strict=True)]
    batch = pack(prompts, completions, PAD)
    assert torch.equal(batch.completion_mask.bool(), cmask[:, : batch.completion_mask.shape[1]])
    n, t = batch.completion_ids.shape
    with torch.no_grad():
        logp, _ = completion_logprobs_and_entropy(trainer.model, batch)
    gen = torch.Generator().manual_seed(1)
    # Old and reference log-probs away from the current ones, so the clip and the KL act.
    old = logp + (torch.rand(n, t, generator=gen, dtype=torch.float64) - 0.5) * 0.8
    ref = logp + (torch.rand(n, t, generator=gen, dtype=torch.float64) - 0.5) * 0.6
    mask = batch.completion_mask.to(torch.float64)
    rows = Rows(prompts=prompts, completions=completions,
                advantages=inputs["advantages"].to(torch.float64), mask=mask,
                weights=torch.ones(n, t, dtype=torch.float64),
                demo=torch.zeros(n, dtype=torch.bool), group=torch.full((n,), -1),
                own=torch.ones(n, dtype=torch.bool), logp_old=old * mask, ref_logp=ref * mask)
    pad_to = inputs["completion_ids"].shape[1]
    inputs["old_per_token_logps"] = torch.nn.functional.pad(old * mask, (0, pad_to - t))
    inputs["ref_per_token_logps"] = torch.nn.functional.pad(ref * mask, (0, pad_to - t))

    def ours_for_trl(model: Any, *_: Any, **__: Any) -> tuple[torch.Tensor, torch.Tensor, None]:
        lp, ent = completion_logprobs_and_entropy(model, batch)
        return (torch.nn.functional.pad(lp, (0, pad_to - t)),
                torch.nn.functional.pad(ent, (0, pad_to - t)), None)

    trainer._get_per_token_logps_and_entropies = ours_for_trl
    yield Round(trainer=trainer, inputs=inputs, rewards=rewards, batch=batch, rows=rows)


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    out = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
           for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return out


def _trl_and_ours(r: Round, loss_type: str, level: str = "token", beta: float = 0.0,
                  entropy_coef: float = 0.0) -> tuple[float, float, list[torch.Tensor],
                                                      list[torch.Tensor], dict[str, float]]:
    tr = r.trainer
    tr.loss_type, tr.importance_sampling_level, tr.beta = loss_type, level, beta
    tr.entropy_coef, tr._entropy_bonus_enabled = entropy_coef, entropy_coef != 0.0
    tr.model.zero_grad(set_to_none=True)
    theirs = tr._compute_loss(tr.model, r.inputs)
    theirs.backward()
    g_theirs = _grads(tr.model)
    grpo = GRPOSettings(aggregation=TRL_AGGREGATION[loss_type], importance_sampling_level=level,
                        beta=beta, entropy_coef=entropy_coef, eps_lo=0.2, eps_hi=0.28,
                        max_new_tokens=MAX_LEN, micro_batch_tokens=40, logit_chunk_tokens=5)
    stats = accumulate(tr.model, r.rows, list(range(len(r.rows))),
                       StepSettings.of(grpo, ProbeSettings(), PAD, MAX_LEN))
    return float(theirs.detach()), stats["loss"], g_theirs, _grads(tr.model), stats


def _assert_close(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    scale = max(float(x.abs().max()) for x in b)
    assert scale > 0
    assert max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True)) <= 1e-10 * scale


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_loss_and_gradient_equal_trl(trl_round: Round, loss_type: str, level: str) -> None:
    theirs, ours, g_theirs, g_ours, stats = _trl_and_ours(trl_round, loss_type, level)
    assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-14)
    assert abs(theirs) > 1e-3
    _assert_close(g_ours, g_theirs)
    if level == "token":  # TRL counts a sequence-level clip once per sequence, ours per token
        region = trl_round.trainer._metrics["train"]["clip_ratio/region_mean"][-1]
        assert stats["clip_frac"] == pytest.approx(region, rel=1e-6)
        assert stats["clip_frac"] > 0


def test_gspo_differs_from_token_ratio(trl_round: Round) -> None:
    """The sequence ratio is a different loss, not a relabelling of the token one."""
    token = _trl_and_ours(trl_round, "dapo", "token")[1]
    sequence = _trl_and_ours(trl_round, "dapo", "sequence")[1]
    assert abs(token - sequence) > 1e-4


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_kl_and_entropy_bonus_equal_trl(trl_round: Round, loss_type: str) -> None:
    theirs, ours, g_theirs, g_ours, stats = _trl_and_ours(trl_round, loss_type, "token",
                                                         beta=0.05, entropy_coef=0.3)
    assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-14)
    _assert_close(g_ours, g_theirs)
    without = _trl_and_ours(trl_round, loss_type, "token", beta=0.05)[1]
    entropy = trl_round.trainer._metrics["train"]["entropy"][-1]
    assert stats["entropy"] == pytest.approx(entropy, rel=1e-6)
    assert ours == pytest.approx(without - 0.3 * stats["entropy"], rel=1e-10)


def test_scale_rewards_none_equals_trl(trl_round: Round) -> None:
    rewards = torch.tensor(trl_round.rewards[: len(PROMPTS)], dtype=torch.float64).reshape(-1, G)
    assert bool((rewards.std(dim=-1) > 0).all())  # the std would change these advantages
    ours = group_advantages(rewards, scale="none").reshape(-1)
    assert torch.equal(ours, trl_round.inputs["advantages"].to(torch.float64))
    assert not torch.equal(group_advantages(rewards).reshape(-1), ours)
