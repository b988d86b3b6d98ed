"""SGT: the rescue gate and the rescue NLL term."""

import math

import torch

from mutualrl.trainer.algos.sgt import PeerSuccess, rescue_set, sgt_loss

torch.set_num_threads(1)


def test_rescue_gate() -> None:
    own_max = {"p1": 0.0, "p2": 1.0, "p3": 0.0, "p4": 0.0}
    cands = [
        PeerSuccess("p1", "B", "95;", 1.0),
        PeerSuccess("p1", "B", "95;", 1.0),  # duplicate text counted once
        PeerSuccess("p1", "C", "9 5;", 1.0),
        PeerSuccess("p2", "B", "x;", 1.0),  # own success: no rescue needed
        PeerSuccess("p3", "B", "y", 1.0, truncated=True),  # truncated never counts
        PeerSuccess("p3", "B", "z;", 1.0, verified=False),  # unverified never enters
        PeerSuccess("p3", "B", "w;", 0.5),  # below tau
        PeerSuccess("p4", "A", "own;", 1.0),  # own policy's record
        PeerSuccess("p9", "B", "other;", 1.0),  # prompt not answered this round
    ]
    assert rescue_set(own_max, cands, own_policy="A", tau=1.0) == {"p1": ["95;", "9 5;"]}
    assert rescue_set(own_max, cands, "A", 1.0, max_per_prompt=1) == {"p1": ["95;"]}
    assert rescue_set(own_max, [], "A") == {}


def test_sgt_loss_by_hand() -> None:
    # Prompt 7: two demos (lengths 2 and 1); prompt 3: one demo (length 3).
    logp = torch.tensor(
        [[-1.0, -3.0, 0.0], [-0.5, 0.0, 0.0], [-0.3, -0.6, -0.9]], dtype=torch.float64
    )
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    prompt = torch.tensor([7, 7, 3])
    loss = sgt_loss(logp, mask, prompt, lam=0.5)
    p7 = ((-1.0 - 3.0) / 2 + (-0.5) / 1) / 2
    p3 = (-0.3 - 0.6 - 0.9) / 3
    assert abs(float(loss) - (-0.5 * (p7 + p3) / 2)) < 1e-12


def test_sgt_loss_empty_is_zero_and_differentiable() -> None:
    logp = torch.zeros(0, 4, requires_grad=True)
    loss = sgt_loss(logp, torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), lam=1.0)
    assert float(loss.detach()) == 0.0
    loss.backward()


def test_sgt_gradient_raises_likelihood() -> None:
    logits = torch.zeros(1, 2, 5, requires_grad=True)
    target = torch.tensor([[1, 3]])
    logp = torch.log_softmax(logits, -1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
    sgt_loss(logp, torch.ones(1, 2), torch.zeros(1, dtype=torch.long), 1.0).backward()
    with torch.no_grad():
        new = logits - 1.0 * logits.grad
        after = torch.log_softmax(new, -1).gather(-1, target.unsqueeze(-1)).sum()
    assert float(after) > 2 * math.log(1 / 5)
