"""HACPO as its paper runs it (arXiv 2603.02604; the experiment's `hacpo` arm), pinned to
values worked out by hand from the paper's equations in the comments: the capability-weighted
joint baseline on the learner's own rows (eq. (5)-(6)), GSPO's sequence ratio with its clip
radii and the log-ratio clamp on own rows (eq. (56)-(57)), the stepwise lower clip of peer
ratios over the round's mini-batches (eq. (58)-(59)), the ratio-length ablation, the
zero-variance filter under a shared baseline, and the gradient diagnostic by row class."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from tiny_round import FakeSample, tiny_model

from mutualrl.experiment.config import load_experiment
from mutualrl.experiment.plan import build_plan
from mutualrl.trainer.algos import hacpo
from mutualrl.trainer.algos.loss import group_advantages, token_loss
from mutualrl.trainer.config.run import ExchangeSettings, GRPOSettings, ProbeSettings, TrainerConfig
from mutualrl.trainer.data.tasks import Prompt
from mutualrl.trainer.runtime.step import StepSettings, optimise, round_rows, score
from mutualrl.trainer.sharing.exchange import PeerRollout
from mutualrl.trainer.sharing.probes import LossInputs, PeerRows, RoundData
from mutualrl.trainer.sharing.probes.hacpo import HACPOProbe

ROOT = Path(__file__).resolve().parents[2]
S = ProbeSettings(kind="hacpo")
PAPER = GRPOSettings(importance_sampling_level="sequence", eps_lo=3e-4, eps_hi=4e-4,
                     mini_batches=2, aggregation="sequence_mean", max_log_ratio=10.0)


def t(xs: list[float]) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


def rollout(policy: str, prompt: str, reward: float, k: int) -> PeerRollout:
    return PeerRollout(delivery_id=f"d{k}", policy=policy, round=0, prompt_id=prompt,
                       text="x", tokenizer_id="t", token_ids=[5], offsets=[(0, 1)],
                       logprobs=[-1.0], reward=reward, record_id=f"{policy}/0/{prompt}/{k}/r")


def one_prompt_round(own: list[float]) -> RoundData:
    return RoundData(round=0, prompts=[Prompt(id="p0", skill="add", text="p0", answer="")],
                     samples=[[FakeSample([3, 2]) for _ in own]], rewards=t([own]))


# Eq. (5)-(6): the joint baseline reaches own rows -------------------------------------------

def test_an_all_wrong_own_group_beside_a_mixed_peer_group_learns_from_the_joint_baseline(
        ) -> None:
    # Learner k: 4 own rewards 0. Peer j: rewards 1, 1, 0, 0. P_k = 0.2, P_j = 0.5, so the
    # peer rewards weigh clip(P_k / P_j) = 0.4 in the baseline (own ones 1):
    #   mu = (0 * 4 + 0.4 * (1 + 1)) / 8 = 0.1
    #   sigma = std(0, 0, 0, 0, 1, 1, 0, 0) = sqrt(0.25 * 0.75) = 0.4330127 (ddof 0)
    #   own A = (0 - 0.1) / sigma = -0.2309401; peer A = (1 - 0.1) / sigma = 2.0784610 for the
    #   successes, -0.2309401 for the failures. GRPO's own advantage would be 0 for all four.
    probe = HACPOProbe(S, "k", None, sharing=ExchangeSettings(mode="deterministic",
                                                              staleness=0))
    assert probe.lag == 0  # the paper's configuration reads the peers' same round
    probe.capability.record("k", 0, 0.2)
    probe.capability.record("j", 0, 0.5)
    data = one_prompt_round([0.0, 0.0, 0.0, 0.0])
    peers = {0: [rollout("j", "p0", r, i) for i, r in enumerate([1.0, 1.0, 0.0, 0.0])]}
    baseline = {0: [probe.ratio("k", "j")] * 4}
    own, peer = probe.advantages(data, peers, baseline=baseline)
    sigma = math.sqrt(0.25 * 0.75)
    assert own[0].tolist() == pytest.approx([-0.1 / (sigma + 1e-6)] * 4, rel=1e-12)
    assert peer[0].tolist() == pytest.approx(
        [0.9 / (sigma + 1e-6)] * 2 + [-0.1 / (sigma + 1e-6)] * 2, rel=1e-12)
    assert group_advantages(data.rewards)[0].abs().max() == 0


def test_the_paper_arm_reads_the_same_round_and_runs_gspo_on_four_mini_batches() -> None:
    cfg, _ = load_experiment(ROOT / "configs" / "published-methods.yaml")
    plan = build_plan(cfg, Path("/tmp/pm-plan"))
    by_probe = {r.probe: r for r in plan.runs if r.regime == "short" and r.seed == 0}
    paper = TrainerConfig.model_validate(by_probe["hacpo"].trainer)
    stale = TrainerConfig.model_validate(by_probe["hacpo-stale"].trainer)
    assert paper.exchange.staleness == 0 and stale.exchange.staleness == 1
    g = paper.grpo
    assert (g.importance_sampling_level, g.eps_lo, g.eps_hi, g.mini_batches, g.aggregation,
            g.max_log_ratio) == ("sequence", 3e-4, 4e-4, 4, "sequence_mean", 10.0)
    assert (stale.grpo.importance_sampling_level, stale.grpo.mini_batches) == ("token", 1)
    nofloor = TrainerConfig.model_validate(by_probe["hacpo-nofloor"].trainer).probe
    assert (nofloor.hacpo_delta, nofloor.hacpo_alpha, nofloor.hacpo_delta_step) == (1, 0, 0)
    samelen = TrainerConfig.model_validate(by_probe["hacpo-samelen"].trainer)
    assert samelen.probe.hacpo_ratio_length == "learner" and samelen.exchange.staleness == 0


# Eq. (56)-(57): own rows are GSPO with its clip radii and the log-ratio clamp ---------------

def own_row(logp: list[float], old: list[float], adv: float, grpo: GRPOSettings
            ) -> tuple[float, list[float]]:
    lp = t(logp).unsqueeze(0).requires_grad_(True)
    mask = torch.ones_like(lp)
    out = token_loss(lp, t(old).unsqueeze(0), t([adv]), grpo, mask=mask)
    out.total[0, 0].backward()
    assert lp.grad is not None
    return float(out.total[0, 0].detach()), lp.grad[0].tolist()


def test_own_rows_take_gspo_sequence_ratio_and_clip_radii() -> None:
    # log ratios 0.01, -0.02, 0.04: their mean 0.01, s = exp(0.01) = 1.0100502 for the whole
    # row. A = +1: s is past 1 + 4e-4, min(s A, 1.0004 A) = 1.0004: clipped, no gradient.
    value, grad = own_row([-1.0, -2.0, -3.0], [-1.01, -1.98, -3.04], 1.0, PAPER)
    assert value == pytest.approx(-1.0004)
    assert grad == [0.0, 0.0, 0.0]
    # A = -1: min(-s, -1.0004) = -s, unclipped: value s, d value / d logp_t = s / 3 on every
    # token of the row (a token ratio would give each token its own exp(log ratio_t) / 1).
    value, grad = own_row([-1.0, -2.0, -3.0], [-1.01, -1.98, -3.04], -1.0, PAPER)
    s = math.exp(0.01)
    assert value == pytest.approx(s)
    assert grad == pytest.approx([s / 3] * 3)
    # The clamp: a mean log ratio of 15 is taken as 10 (A = -1: value exp(10), and the
    # clamp leaves no gradient).
    value, grad = own_row([-1.0, -1.0], [-16.0, -16.0], -1.0, PAPER)
    assert value == pytest.approx(math.exp(10.0))
    assert grad == [0.0, 0.0]
    unclamped = PAPER.model_copy(update={"max_log_ratio": None})
    assert own_row([-1.0, -1.0], [-16.0, -16.0], -1.0, unclamped)[0] == pytest.approx(
        math.exp(15.0))


# Eq. (58)-(59): the stepwise lower clip over the round's mini-batches -----------------------

def peer_round(sender_means: list[float], adv: list[float], rescue: list[bool]
               ) -> tuple[list[list[int]], RoundData, LossInputs]:
    """Two prompts x two own samples with equal rewards (zero GRPO advantage, so only peer
    rows move the model), and one peer row per prompt."""
    prompts = [[1, 5, 6], [1, 7]]
    data = RoundData(
        round=0, prompts=[Prompt(id=f"p{i}", skill="add", text="", answer="") for i in (0, 1)],
        samples=[[FakeSample([3, 2]), FakeSample([4, 2])],
                 [FakeSample([8, 2]), FakeSample([9, 2])]],
        rewards=t([[0.0, 0.0], [0.0, 0.0]]))
    peers = PeerRows(prompt_index=[0, 1], token_ids=[[10, 2], [11, 2]], advantages=t(adv),
                     sender_logp_sum=t([2 * m for m in sender_means]), method="hacpo",
                     sender_tokens=t([2.0, 2.0]), capability=t([1.0, 1.0]),
                     rescue=torch.tensor(rescue))
    return prompts, data, LossInputs(advantages=torch.zeros(2, 2, dtype=torch.float64),
                                     peers=peers)


def test_the_lower_clip_tightens_at_the_second_mini_batch() -> None:
    model = tiny_model()
    prompts, data, plan = peer_round([0.0, 0.0], [1.0, 1.0], [True, False])
    rows, _ = round_rows(prompts, data, plan, PAPER)
    # Each peer row's sender mean is set so that log s = mean logp − sender mean = log 0.81:
    # s = 0.81 sits inside [l_0, 1] = [0.8, 1] at update 0 and below l_1 = 0.825 at update 1.
    st = StepSettings.of(PAPER, S, 0, 8)
    logp = score(model, rows, [4, 5], st, torch.device("cpu"))
    assert plan.peers is not None
    for j, i in enumerate((4, 5)):
        plan.peers.sender_logp_sum[j] = 2 * (float(logp[i, :2].mean()) - math.log(0.81))
    assert hacpo.cross_lower(S, 0) == pytest.approx(0.8)
    assert hacpo.cross_lower(S, 1) == pytest.approx(0.825)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: both updates see s = 0.81
    result = optimise(model, None, opt, prompts, data, plan, st)
    assert len(result.updates) == 2
    # Mini-batch 0 holds peer row 0 (the rescue row) and carries its gradient; mini-batch 1
    # holds peer row 1, whose s = 0.81 < l_1 is clipped: no gradient.
    u0, u1 = result.updates
    assert (u0["peer_rows_rescue"], u0["peer_grad_rescue"]) == (1.0, 1.0)
    assert (u1["peer_rows_other"], u1["peer_grad_other"]) == (1.0, 0.0)
    assert result.stats["peer_grad_share_rescue"] == 1.0
    assert result.stats["peer_grad_share_other"] == 0.0


# The ratio-length ablation --------------------------------------------------------------------

def test_one_length_on_both_sides_gives_agreeing_models_ratio_one() -> None:
    # Both models give the completion -3 nats in all. The learner's 5 BPE tokens: mean -0.6;
    # the sender's 12 characters: mean -0.25. The paper's ratio: exp(-0.6 + 0.25) = 0.7047,
    # below l_0 = 0.8 (clipped, no gradient) although the models agree. With the learner's
    # count on both sides: exp(-0.6 + 3 / 5) = 1.
    logp = t([[-0.6] * 5])
    mask = torch.ones_like(logp)

    class Rows:
        sender_logp_sum = t([-3.0])
        sender_tokens = t([12.0])
        capability = None

    paper = hacpo.cross_rows(logp, mask, Rows(), S)
    assert paper.stats["hacpo_log_s"] == pytest.approx(-0.35)
    assert paper.stats["hacpo_s_below"] == 1.0
    same = hacpo.cross_rows(logp, mask, Rows(),
                            S.model_copy(update={"hacpo_ratio_length": "learner"}))
    assert same.stats["hacpo_log_s"] == pytest.approx(0.0, abs=1e-15)
    assert same.stats["hacpo_s_below"] == 0.0


# The zero-variance filter under a shared baseline -----------------------------------------

def test_filter_keeps_equal_own_rewards_that_a_shared_baseline_gives_a_signal() -> None:
    grpo = GRPOSettings(filter_zero_variance=True)
    data = RoundData(
        round=0, prompts=[Prompt(id=f"p{i}", skill="add", text="", answer="") for i in (0, 1)],
        samples=[[FakeSample([3, 2]), FakeSample([4, 2])],
                 [FakeSample([8, 2]), FakeSample([9, 2])]],
        rewards=t([[0.0, 0.0], [1.0, 0.0]]))
    prompts = [[1, 5], [1, 7]]
    # GRPO's own advantages: group 0 is all 0 and is dropped.
    rows, stats = round_rows(prompts, data, LossInputs(group_advantages(data.rewards)), grpo)
    assert stats["filtered_groups"] == 1.0 and rows.mask[:2].sum() == 0
    # HACPO's joint baseline gave group 0 advantages of -0.23: it stays in the loss.
    shared = t([[-0.23, -0.23], [1.0, -1.0]])
    rows, stats = round_rows(prompts, data, LossInputs(shared), grpo)
    assert stats["filtered_groups"] == 0.0 and rows.mask[:2].sum() == 4


# The gradient diagnostic ----------------------------------------------------------------------

def test_zero_advantage_peer_rows_carry_no_gradient() -> None:
    model = tiny_model()
    prompts, data, plan = peer_round([-3.0, -3.0], [0.0, 0.7], [True, False])
    probe = ProbeSettings(kind="sapo")
    assert plan.peers is not None
    plan.peers.method = "sapo"
    grpo = GRPOSettings()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    stats = optimise(model, None, opt, prompts, data, plan,
                     StepSettings.of(grpo, probe, 0, 8)).stats
    # The rescue row's advantage is 0 (its group had equal rewards): no gradient; the other
    # row's SAPO term -A * rho has one.
    assert stats["peer_rows_rescue"] == 1.0 and stats["peer_grad_share_rescue"] == 0.0
    assert stats["peer_rows_other"] == 1.0 and stats["peer_grad_share_other"] == 1.0
