"""PRP: importance weights (sequence and chunk level), weight modes, pooled advantages."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mutualrl.trainer.algos.loss import group_advantages
from mutualrl.trainer.algos.prp import (
    apply_weight_mode,
    chunk_log_weight,
    chunk_to_tokens,
    pooled_advantages,
    sequence_log_weight,
    weight_stats,
)

torch.set_num_threads(1)


def test_weights_one_when_peer_is_self() -> None:
    g = torch.Generator().manual_seed(1)
    logp = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 3
    mask = torch.ones(4, 6)
    mask[2, 4:] = 0
    log_w = sequence_log_weight(logp, mask, logp, mask)
    assert torch.equal(log_w, torch.zeros(4, dtype=torch.float64))
    ones = torch.ones(4, dtype=torch.float64)
    for mode in ("drop", "truncate", "none"):
        assert torch.equal(apply_weight_mode(log_w, mode).weights, ones)
    chunks = -torch.rand(4, 3, generator=g, dtype=torch.float64)
    chunk_w = apply_weight_mode(chunk_log_weight(chunks, chunks), "drop").weights
    assert torch.equal(chunk_w, torch.ones(4, 3, dtype=torch.float64))


def test_sequence_log_weight_by_hand() -> None:
    # Receiver: 3 tokens, sum -3.0; sender: 2 tokens (one padded), sum -1.5 -> (-3 + 1.5) / 3.
    recv = torch.tensor([[-1.0, -1.0, -1.0]])
    send = torch.tensor([[-0.5, -1.0, -9.0]])
    lw = sequence_log_weight(recv, torch.ones(1, 3), send, torch.tensor([[1, 1, 0]]))
    assert abs(float(lw[0]) - (-0.5)) < 1e-7


def test_modes_by_hand() -> None:
    log_w = torch.log(torch.tensor([0.5, 0.85, 1.0, 1.7]))
    drop = apply_weight_mode(log_w, "drop", delta=0.2)
    torch.testing.assert_close(drop.weights, torch.tensor([0.0, 0.85, 1.0, 1.0]))
    assert drop.kept.tolist() == [False, True, True, True]
    assert drop.clipped.tolist() == [False, False, False, True]
    trunc = apply_weight_mode(log_w, "truncate", cap=1.5)
    torch.testing.assert_close(trunc.weights, torch.tensor([0.5, 0.85, 1.0, 1.5]))
    assert trunc.kept.all() and trunc.clipped.tolist() == [False, False, False, True]
    assert torch.equal(apply_weight_mode(log_w, "none").weights, torch.ones(4))
    stats = weight_stats(drop)
    raw = [0.5, 0.85, 1.0, 1.7]
    m = sum(raw) / 4
    assert abs(stats["mean"] - m) < 1e-6
    assert abs(stats["var"] - sum((x - m) ** 2 for x in raw) / 4) < 1e-6
    assert stats["kept"] == 0.75 and stats["clipped"] == 0.25 and stats["n"] == 4
    assert abs(stats["mean_log"] - sum(math.log(x) for x in raw) / 4) < 1e-6


def test_chunk_to_tokens() -> None:
    w = torch.tensor([[0.5, 2.0]])
    tok = torch.tensor([[0, 0, 1, -1]])
    assert chunk_to_tokens(w, tok).tolist() == [[0.5, 0.5, 2.0, 0.0]]


def test_pooled_advantages_no_peers_is_grpo() -> None:
    r = torch.tensor([[1.0, 0.0, 0.0], [0.2, 0.9, 0.4]])
    own, peer = pooled_advantages(r, [torch.zeros(0), torch.zeros(0)])
    assert torch.equal(own, group_advantages(r))
    assert all(p.numel() == 0 for p in peer)


def test_pooled_advantages_with_peers() -> None:
    r = torch.tensor([[0.0, 0.0], [0.0, 1.0]])
    own, peer = pooled_advantages(r, [torch.tensor([1.0, 1.0]), torch.zeros(0)])
    union = group_advantages(torch.tensor([0.0, 0.0, 1.0, 1.0]))
    assert torch.equal(own[0], union[:2]) and torch.equal(peer[0], union[2:])
    assert torch.equal(own[1], group_advantages(r)[1])


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.floats(-20.0, 5.0, allow_nan=False), min_size=1, max_size=16),
    st.floats(0.01, 0.99),
)
def test_drop_weights_within_band(log_ws: list[float], delta: float) -> None:
    w = apply_weight_mode(torch.tensor(log_ws, dtype=torch.float64), "drop", delta=delta)
    kept = w.weights[w.kept]
    assert bool(((kept >= 1 - delta) & (kept <= 1)).all())
    assert bool((w.weights[~w.kept] == 0).all())
