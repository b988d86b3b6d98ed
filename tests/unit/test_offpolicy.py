"""The off-policy correction (algos.offpolicy) against hand-computed values, its bounds as
properties, and the round's loss: exactly today's when the round's own weights sampled it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_round import PAD, FakeSample, fixed_round, tiny_model

from mutualrl.trainer.algos.modes import OffPolicyCorrection, RatioLevel
from mutualrl.trainer.algos.offpolicy import behaviour_weights
from mutualrl.trainer.config.run import GRPOSettings, ProbeSettings
from mutualrl.trainer.runtime.step import StepSettings, optimise
from mutualrl.trainer.sharing.probes import make_probe


@dataclass
class S:
    off_policy_correction: OffPolicyCorrection = "tis"
    off_policy_level: RatioLevel = "token"
    off_policy_cap: float = 2.0


LN = math.log
# two rows of three tokens; row 1's last token is padding
CUR = torch.tensor([[LN(0.5), LN(0.9), LN(0.2)], [LN(0.3), LN(0.6), 0.0]], dtype=torch.float64)
BEH = torch.tensor([[LN(0.1), LN(0.9), LN(0.8)], [LN(0.4), LN(0.5), 0.0]], dtype=torch.float64)
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)


def test_token_tis_is_min_of_ratio_and_cap() -> None:
    w = behaviour_weights(CUR, BEH, MASK, S()).weights
    # r = 0.5/0.1 = 5 -> 2; 0.9/0.9 = 1; 0.2/0.8 = 0.25; 0.3/0.4 = 0.75; 0.6/0.5 = 1.2
    want = torch.tensor([[2.0, 1.0, 0.25], [0.75, 1.2, 1.0]], dtype=torch.float64)
    assert torch.allclose(w, want, atol=1e-12)
    assert behaviour_weights(CUR, BEH, MASK, S()).stats["offpolicy/truncated"] == 1 / 5


def test_sequence_tis_is_the_product_of_the_row_capped() -> None:
    w = behaviour_weights(CUR, BEH, MASK, S(off_policy_level="sequence")).weights
    # row 0: 5 * 1 * 0.25 = 1.25; row 1: 0.75 * 1.2 = 0.9 (the padding token does not count)
    assert torch.allclose(w[0], torch.full((3,), 1.25, dtype=torch.float64))
    assert torch.allclose(w[1], torch.full((3,), 0.9, dtype=torch.float64))
    capped = behaviour_weights(CUR, BEH, MASK, S("tis", "sequence", 1.1)).weights
    assert torch.allclose(capped[0], torch.full((3,), 1.1, dtype=torch.float64))


def test_mis_keeps_the_ratio_inside_the_band_and_masks_beyond() -> None:
    out = behaviour_weights(CUR, BEH, MASK, S("mis"))
    # band [0.5, 2]: 5 and 0.25 leave, 1, 0.75, 1.2 stay with their ratio
    assert out.keep.tolist() == [[0.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    want = torch.tensor([[0.0, 1.0, 0.0], [0.75, 1.2, 1.0]], dtype=torch.float64)
    assert torch.allclose(out.weights, want, atol=1e-12)
    assert out.stats["offpolicy/masked"] == 2 / 5
    seq = behaviour_weights(CUR, BEH, MASK, S("mis", "sequence", 1.2))
    assert seq.keep[0].tolist() == [0.0, 0.0, 0.0] and seq.keep[1].tolist() == [1.0] * 3


def test_none_is_one() -> None:
    assert torch.equal(behaviour_weights(CUR, BEH, MASK, S("none")).weights,
                       torch.ones_like(CUR))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-30, 0), min_size=4, max_size=4),
       st.lists(st.floats(-30, 0), min_size=4, max_size=4),
       st.floats(1.0, 20.0), st.sampled_from(["token", "sequence"]))
def test_weights_are_bounded_and_one_on_policy(cur: list[float], beh: list[float], cap: float,
                                               level: RatioLevel) -> None:
    c = torch.tensor([cur], dtype=torch.float64)
    b = torch.tensor([beh], dtype=torch.float64)
    m = torch.ones_like(c)
    tis = behaviour_weights(c, b, m, S("tis", level, cap)).weights
    assert bool((tis >= 0).all()) and bool((tis <= cap * (1 + 1e-12)).all())
    mis = behaviour_weights(c, b, m, S("mis", level, cap))
    inside = mis.keep.bool()
    assert bool((mis.weights[~inside] == 0).all())
    assert bool((mis.weights[inside] <= cap * (1 + 1e-12)).all())
    assert bool((mis.weights[inside] >= (1 / cap) * (1 - 1e-12)).all())
    same = behaviour_weights(c, c, m, S("tis", level, cap))
    assert torch.equal(same.weights, torch.ones_like(c))


def _step(version: int | None, grpo: GRPOSettings, logprob: float = -1.0) -> dict[str, float]:
    torch.manual_seed(0)
    model = tiny_model()
    prompt_ids, data = fixed_round()
    data.round = 1
    data.policy_version = version
    data.samples = [[FakeSample(s.token_ids, logprobs=[logprob] * len(s.token_ids))
                     for s in row] for row in data.samples]
    probe = make_probe(ProbeSettings(kind="none"), "A", None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    st_ = StepSettings.of(grpo, ProbeSettings(), PAD, 8)
    res = optimise(model, None, opt, prompt_ids, data, probe.plan(data), st_)
    return {**res.stats, "p": float(sum(p.detach().sum() for p in model.parameters()))}


def test_the_round_loss_is_todays_when_its_own_weights_sampled_it() -> None:
    g = GRPOSettings()
    today = _step(None, g)
    assert _step(1, g) == today  # version == round: weight exactly 1, nothing computed
    lagged = _step(0, g)  # version 0 sampled round 1: corrected
    assert "offpolicy/ratio_mean" in lagged and lagged["p"] != today["p"]
    # a behaviour that is the current policy would weigh 1: the loss differs only through w
    uncorrected = _step(0, GRPOSettings(off_policy_correction="none"))
    assert uncorrected["loss"] == today["loss"] and lagged["loss"] != today["loss"]
