"""GRPO core: advantages (ddof=0), clipped loss (asymmetric clip), k3 KL, aggregation modes."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mutualrl.trainer.algos.loss import (
    EPS,
    aggregate,
    group_advantages,
    grpo_loss,
    k3_kl,
    nonzero_variance_groups,
)
from mutualrl.trainer.algos.modes import PAPER_NAMES
from mutualrl.trainer.config.run import GRPOSettings

torch.set_num_threads(1)

# Two prompts x three samples; rewards, ratios rho per token (T = 2, row 2 and 5 padded).
REWARDS = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]], dtype=torch.float64)
RHO = torch.tensor(
    [[1.5, 1.0], [0.7, 1.1], [0.9, 1.0], [1.25, 1.3], [0.75, 0.85], [1.0, 1.0]],
    dtype=torch.float64,
)
MASK = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1], [1, 1], [1, 0]])
LOGP_OLD = torch.full((6, 2), math.log(0.5), dtype=torch.float64)
LOGP = LOGP_OLD + torch.log(RHO)

# By hand: mean 1/3 or 2/3, population std sqrt(2)/3 in both groups.
S = math.sqrt(2) / 3
A = (2 / 3) / (S + EPS)  # |advantage| of the odd one out
B = (1 / 3) / (S + EPS)  # |advantage| of the two others
# Per-token -min(rho*A, clip(rho, 0.8, 1.28)*A), row by row:
ROW_TOKENS = [
    [-1.28 * A, -1.0 * A],  # A>0, rho 1.5 clipped high at 1.28
    [0.8 * B, 1.1 * B],  # A<0, rho 0.7 clipped low at 0.8; rho 1.1 unclipped
    [0.9 * B],
    [1.25 * A, 1.3 * A],  # A<0: rho 1.3 above 1+eps_hi is NOT clipped (pessimistic min)
    [-0.75 * B, -0.85 * B],  # A>0: rho 0.75 below 1-eps_lo is NOT clipped
    [-1.0 * B],
]


def test_advantages_ddof0_by_hand() -> None:
    adv = group_advantages(REWARDS)
    expected = torch.tensor([[A, -B, -B], [-A, B, B]], dtype=torch.float64)
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-12)
    # ddof=1 would give std sqrt(1/3) and advantage 1.1547 for the odd one out.
    assert abs(float(adv[0, 0]) - 1.1547005) > 0.2


def test_advantages_constant_group_is_zero() -> None:
    adv = group_advantages(torch.tensor([[0.5, 0.5, 0.5, 0.5]]))
    assert torch.equal(adv, torch.zeros(1, 4))


def test_loss_token_mean_by_hand() -> None:
    adv = group_advantages(REWARDS).reshape(-1)
    out = grpo_loss(LOGP, LOGP_OLD, adv, MASK,
                    GRPOSettings(eps_lo=0.2, eps_hi=0.28, aggregation="token_mean"))
    total = sum(sum(r) for r in ROW_TOKENS)
    assert abs(float(out.loss) - total / 10) < 1e-6
    assert abs(out.clip_frac_low - 0.1) < 1e-12
    assert abs(out.clip_frac_high - 0.1) < 1e-12
    assert abs(out.clip_frac - 0.2) < 1e-12
    assert out.kl == 0.0


def test_loss_sequence_mean_and_constant_length_by_hand() -> None:
    adv = group_advantages(REWARDS).reshape(-1)
    per_seq = [sum(r) / len(r) for r in ROW_TOKENS]
    out = grpo_loss(LOGP, LOGP_OLD, adv, MASK, GRPOSettings(aggregation="sequence_mean"))
    assert abs(float(out.loss) - sum(per_seq) / 6) < 1e-6
    out = grpo_loss(LOGP, LOGP_OLD, adv, MASK, GRPOSettings(aggregation="constant_length"),
                    max_len=4)
    assert abs(float(out.loss) - sum(sum(r) for r in ROW_TOKENS) / (6 * 4)) < 1e-6


def test_clip_asymmetry_pinned() -> None:
    """Swapping eps_lo and eps_hi changes the two clipped tokens: 1.28A -> 1.2A, 0.8B -> 0.72B."""
    adv = group_advantages(REWARDS).reshape(-1)
    swapped = grpo_loss(LOGP, LOGP_OLD, adv, MASK, GRPOSettings(eps_lo=0.28, eps_hi=0.2))
    total = sum(sum(r) for r in ROW_TOKENS) + (1.28 - 1.2) * A + (0.72 - 0.8) * B
    assert abs(float(swapped.loss) - total / 10) < 1e-6
    normal = grpo_loss(LOGP, LOGP_OLD, adv, MASK, GRPOSettings(eps_lo=0.2, eps_hi=0.28))
    assert abs(float(swapped.loss) - float(normal.loss)) > 1e-3


def test_k3_kl_by_hand_and_beta() -> None:
    theta = torch.tensor([math.log(0.25), math.log(0.5)], dtype=torch.float64)
    ref = torch.tensor([math.log(0.5), math.log(0.5)], dtype=torch.float64)
    kl = k3_kl(theta, ref)
    assert abs(float(kl[0]) - (2 - math.log(2) - 1)) < 1e-12
    assert float(kl[1]) == 0.0
    # With beta: loss = pg + beta * mean KL (token mean), zero advantages isolate the KL.
    logp = theta.unsqueeze(0)
    out = grpo_loss(
        logp, logp.detach(), torch.zeros(1, dtype=torch.float64), torch.ones(1, 2),
        GRPOSettings(beta=0.1), ref_logp=ref.unsqueeze(0),
    )
    assert abs(float(out.loss) - 0.1 * (1 - math.log(2)) / 2) < 1e-12
    assert abs(out.kl - (1 - math.log(2)) / 2) < 1e-12


def test_gradient_on_policy_is_advantage_times_score() -> None:
    """At rho = 1 the gradient of the token_mean loss wrt logp is -A / num_tokens per token."""
    logp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    grpo_loss(logp, logp.detach(), adv, torch.ones(2, 3), GRPOSettings()).loss.backward()
    expected = torch.tensor([[-1 / 6] * 3, [2 / 6] * 3], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, expected)


def test_zero_variance_filter() -> None:
    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    keep = nonzero_variance_groups(rewards)
    assert keep.tolist() == [[False] * 3, [True] * 3]
    # Filtered group drops out of the token-mean denominator.
    values = torch.ones(6, 2)
    mask = torch.ones(6, 2) * keep.reshape(-1, 1)
    values[3:] = 2.0
    assert float(aggregate(values, mask, "token_mean")) == 2.0
    assert float(aggregate(values, mask, "sequence_mean")) == 2.0
    assert float(aggregate(values, mask, "constant_length", max_len=4)) == 2.0 * 6 / (3 * 4)
    # The paper names are aliases of the same modes.
    for paper, mode in PAPER_NAMES.items():
        assert float(aggregate(values, mask, paper, max_len=4)) == float(
            aggregate(values, mask, mode, max_len=4))
    with pytest.raises(ValueError, match="unknown aggregation mode"):
        aggregate(values, mask, "mean")


def test_weights_scale_pg_only() -> None:
    adv = group_advantages(REWARDS).reshape(-1)
    w = torch.full((6,), 0.5, dtype=torch.float64)
    full = grpo_loss(LOGP, LOGP_OLD, adv, MASK, GRPOSettings())
    half = grpo_loss(LOGP, LOGP_OLD, adv, MASK, GRPOSettings(), weights=w)
    assert abs(float(half.loss) - 0.5 * float(full.loss)) < 1e-12


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=2, max_size=16))
def test_advantages_zero_mean_unit_std(rewards: list[float]) -> None:
    r = torch.tensor(rewards, dtype=torch.float64)
    if float(r.std(correction=0)) < 1e-2:
        return
    adv = group_advantages(r)
    assert abs(float(adv.mean())) < 1e-9
    assert abs(float(adv.std(correction=0)) - 1.0) < 1e-3
