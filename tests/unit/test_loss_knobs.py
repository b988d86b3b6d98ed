"""The loss's knobs by hand: reward scales (group / batch / none) for GRPO and the pooled
probes, GSPO's sequence ratio, the entropy bonus and its log-softmax, and the config's checks.
TRL equality is in test_loss_trl.py, micro-batch equality in test_micro_batch.py."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from tiny_round import fixed_round, tiny_model

from mutualrl.trainer.algos.loss import EPS, SCALES, group_advantages, grpo_loss, token_loss
from mutualrl.trainer.algos.modes import SCALES as SCALE_NAMES
from mutualrl.trainer.algos.prp import pooled_advantages
from mutualrl.trainer.algos.xgrpo import RewardStats, xgrpo_advantages
from mutualrl.trainer.config.run import GRPOSettings, ProbeSettings, TrainerConfig
from mutualrl.trainer.model.batch import completion_logprobs, completion_logprobs_and_entropy, pack
from mutualrl.trainer.sharing.probes import PROBES, make_probe

torch.set_num_threads(1)
REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)


def test_registries_cover_the_config_names() -> None:
    assert tuple(SCALES) == SCALE_NAMES


def test_reward_scales_by_hand() -> None:
    centred = torch.tensor([[0.5, -0.5, -0.5, 0.5], [-0.25, -0.25, -0.25, 0.75]],
                           dtype=torch.float64)
    assert torch.equal(group_advantages(REWARDS, scale="none"), centred)
    group_std = torch.tensor([[0.5], [math.sqrt(3) / 4]], dtype=torch.float64)
    torch.testing.assert_close(group_advantages(REWARDS), centred / (group_std + EPS),
                               rtol=0, atol=1e-12)
    batch_std = math.sqrt(3 / 8 - (3 / 8) ** 2)  # 3 ones in 8, ddof = 0
    torch.testing.assert_close(group_advantages(REWARDS, scale="batch"),
                               centred / (batch_std + EPS), rtol=0, atol=1e-12)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=4, max_size=4),
                min_size=1, max_size=5))
def test_every_scale_centres_each_group(rows: list[list[float]]) -> None:
    r = torch.tensor(rows, dtype=torch.float64)
    none = group_advantages(r, scale="none")
    assert torch.allclose(none.sum(-1), torch.zeros(len(rows), dtype=torch.float64), atol=1e-12)
    # group and batch divide the same centred rewards by one positive number (per group, per
    # round).
    group_std = r.std(dim=-1, correction=0, keepdim=True)
    assert torch.allclose(group_advantages(r) * (group_std + EPS), none, atol=1e-12)
    batch = group_advantages(r, scale="batch")
    assert torch.allclose(batch * (r.std(correction=0) + EPS), none, atol=1e-12)


@pytest.mark.parametrize("scale", SCALE_NAMES)
def test_no_peer_data_is_exactly_grpo_for_every_scale(scale: str) -> None:
    grpo = group_advantages(REWARDS, scale=scale)
    assert torch.equal(xgrpo_advantages(REWARDS, [None, RewardStats()], scale=scale), grpo)
    own, peer = pooled_advantages(REWARDS, [REWARDS.new_zeros(0)] * 2, scale=scale)
    assert torch.equal(own, grpo) and all(p.numel() == 0 for p in peer)
    _, data = fixed_round()
    for kind in PROBES:  # local runs (no exchange) of every probe
        plan = make_probe(ProbeSettings(kind=kind), "A", None, scale=scale).plan(data)
        assert torch.equal(plan.advantages, group_advantages(data.rewards, scale=scale)), kind


def test_pooled_scales_by_hand() -> None:
    peer = RewardStats.of([1.0, 1.0])  # union of row 0: 1,0,0,1,1,1 -> mean 2/3
    union_mean, union_std = 2 / 3, math.sqrt(2 / 9)
    row = REWARDS[0]
    none = xgrpo_advantages(REWARDS, [peer, None], scale="none")
    torch.testing.assert_close(none[0], row - union_mean, rtol=0, atol=1e-12)
    group = xgrpo_advantages(REWARDS, [peer, None], scale="group")
    torch.testing.assert_close(group[0], (row - union_mean) / (union_std + EPS), rtol=0,
                               atol=1e-12)
    batch = xgrpo_advantages(REWARDS, [peer, None], scale="batch")
    own_std = float(REWARDS.std(correction=0))
    torch.testing.assert_close(batch[0], (row - union_mean) / (own_std + EPS), rtol=0,
                               atol=1e-12)
    # PRP: the same union, seen from the peer rows too.
    own, peers = pooled_advantages(REWARDS, [torch.tensor([1.0, 1.0]), REWARDS.new_zeros(0)],
                                   scale="none")
    torch.testing.assert_close(own[0], row - union_mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(peers[0], torch.full((2,), 1 - union_mean, dtype=torch.float64),
                               rtol=0, atol=1e-12)


def test_gspo_sequence_ratio_by_hand() -> None:
    """One ratio per row, the geometric mean of its real tokens' (padding left out), clipped as
    a whole: -min(s A, clip(s) A) on every token of the row."""
    logp_old = torch.zeros(2, 3, dtype=torch.float64)
    log_rho = torch.tensor([[0.3, 0.1, 9.0], [-0.6, -0.3, -0.3]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    parts = token_loss(log_rho, logp_old, adv, GRPOSettings(importance_sampling_level="sequence"),
                       mask=mask)
    s0, s1 = math.exp(0.2), math.exp(-0.4)  # 1.221 (inside 1.28), 0.670 (below 0.8)
    assert parts.pg[0].tolist() == pytest.approx([-s0] * 3)
    assert -2 * s1 > -2 * 0.8  # A < 0: min takes the clipped branch, 0.8 A
    assert parts.pg[1].tolist() == pytest.approx([2 * 0.8] * 3)
    assert parts.clipped_low[1].all() and not parts.clipped_low[0].any()
    token = token_loss(log_rho, logp_old, adv, GRPOSettings(), mask=mask)
    assert token.pg[0, 0] == pytest.approx(-1.28)  # token 0 alone is clipped high
    out = grpo_loss(log_rho, logp_old, adv, mask, GRPOSettings(
        importance_sampling_level="sequence", aggregation="sequence_mean"))
    assert float(out.loss) == pytest.approx((-s0 + 1.6) / 2)


def test_entropy_comes_from_the_same_log_softmax() -> None:
    model = tiny_model().to(torch.float64)
    batch = pack([[1, 5, 6], [1, 8]], [[10, 11, 2], [12]], 0)
    for temperature, chunk in ((1.0, None), (0.7, 2)):
        with torch.no_grad():
            logp, entropy = completion_logprobs_and_entropy(model, batch, temperature, chunk)
            assert torch.equal(logp, completion_logprobs(model, batch, temperature, chunk))
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                           position_ids=batch.position_ids).logits[:, 2:5] / temperature
        full = torch.log_softmax(logits, -1)
        expected = -(full.exp() * full).sum(-1) * batch.completion_mask
        torch.testing.assert_close(entropy, expected, rtol=0, atol=1e-12)
        assert float(entropy[0, 0]) > 0 and float(entropy[1, 1]) == 0.0  # padding


def test_entropy_bonus_lowers_the_loss_by_coef_times_mean_entropy() -> None:
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(3, 4, generator=g, dtype=torch.float64)
    entropy = torch.rand(3, 4, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 0.5], dtype=torch.float64)
    for aggregation in ("token_mean", "sequence_mean", "constant_length"):
        base = grpo_loss(logp, logp - 0.1, adv, mask, GRPOSettings(aggregation=aggregation),
                         max_len=4)
        bonus = grpo_loss(logp, logp - 0.1, adv, mask,
                          GRPOSettings(aggregation=aggregation, entropy_coef=0.2),
                          entropy=entropy, max_len=4)
        mean_h = float((entropy * mask).sum() / mask.sum())
        assert float(bonus.loss) == pytest.approx(float(base.loss) - 0.2 * mean_h, abs=1e-12)
        assert bonus.entropy == pytest.approx(mean_h)


@pytest.mark.parametrize(("field", "value"), [
    ("scale_rewards", "std"), ("importance_sampling_level", "seq"), ("entropy_coef", -0.1),
    ("entropy_coef", float("nan")), ("top_p", 0.0), ("top_p", 1.2), ("top_k", -1),
    ("min_p", -0.5), ("min_p", 1.5)])
def test_bad_knobs_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValidationError, match=rf"grpo\.{field}"):
        TrainerConfig.model_validate({"grpo": {field: value},
                                      "policies": [{"name": "A", "preset": "gpt2-bpe"}]})


def test_knob_defaults_are_todays_grpo() -> None:
    g = GRPOSettings()
    assert (g.scale_rewards, g.importance_sampling_level, g.entropy_coef) == ("group", "token",
                                                                             0.0)
    assert (g.top_p, g.top_k, g.min_p) == (1.0, 0, 0.0)
    g = GRPOSettings(scale_rewards="none", importance_sampling_level="sequence",
                     entropy_coef=0.01, top_p=0.95, top_k=50, min_p=0.05)
    assert (g.scale_rewards, g.importance_sampling_level, g.top_k) == ("none", "sequence", 50)


def test_the_loop_passes_the_knobs_to_the_engine(tmp_path: Path) -> None:
    """One local round with top_k = 1 samples every group's completions alike (the greedy
    one), and with the entropy bonus on, its metric is reported; without truncation the
    samples of a group differ."""
    from mutualrl.trainer.engines.hf import HFEngine
    from mutualrl.trainer.runtime.loop import run_round
    from mutualrl.trainer.runtime.session import build_session

    def session(out: Path, **grpo: object) -> tuple[Any, list[list[list[int]]]]:
        cfg = TrainerConfig.model_validate({
            "run_id": "knobs", "output_dir": str(out), "services": {"local": True},
            "grpo": {"group_size": 4, "prompts_per_round": 3, "rounds": 1, **grpo},
            "eval": {"every": 0}, "checkpoint": {"every": 0},
            "metrics": {"tensorboard": False, "progress": False},
            "policies": [{"name": "A", "preset": "llama-char"}]})
        s = build_session(cfg, "A", cache_dir=tmp_path / "presets")
        seen: list[list[list[int]]] = []

        class Recording(HFEngine):
            def generate(self, *args: Any, **kwargs: Any) -> Any:
                out = super().generate(*args, **kwargs)
                seen.extend([[y.token_ids for y in row] for row in out])
                return out

        s.engine = Recording(s.model, s.tokenizer)
        return s, seen

    s, seen = session(tmp_path / "k1", top_k=1, entropy_coef=0.01,
                      importance_sampling_level="sequence", scale_rewards="none")
    metrics = run_round(s, 0)
    s.close()
    assert seen and all(all(y == row[0] for y in row) for row in seen)
    assert metrics["entropy"] > 0
    s, seen = session(tmp_path / "free")
    metrics = run_round(s, 0)
    s.close()
    assert any(len({tuple(y) for y in row}) > 1 for row in seen)
    assert "entropy" not in metrics
