"""PRP's importance-weight histogram (the dashboard's diagnostics draw it from trainer metrics)."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mutualrl.trainer.algos.prp import HIST_HI, HIST_LO, apply_weight_mode, log_weight_histogram

torch.set_num_threads(1)


def test_bins_by_hand() -> None:
    # log w: -0.5 -> bin -1; 0.0 and 0.9 -> bin 0; 2.5 -> bin 2; -40 -> lowest; 40 -> highest.
    log_w = torch.tensor([-0.5, 0.0, 0.9, 2.5, -40.0, 40.0], dtype=torch.float64)
    w = apply_weight_mode(log_w, "truncate", cap=1.0)
    assert log_weight_histogram(w) == {-1: 1, 0: 2, 2: 1, HIST_LO: 1, HIST_HI - 1: 1}


def test_raw_weights_not_the_clipped_ones_and_valid_mask() -> None:
    log_w = torch.tensor([[3.2, -2.1], [0.3, 7.0]], dtype=torch.float64)
    w = apply_weight_mode(log_w, "drop", delta=0.2)  # drop/clamp change weights, not raw
    assert log_weight_histogram(w) == {3: 1, -3: 1, 0: 1, 5: 1}
    valid = torch.tensor([[True, False], [True, False]])
    assert log_weight_histogram(w, valid) == {3: 1, 0: 1}
    assert log_weight_histogram(w, torch.zeros(2, 2, dtype=torch.bool)) == {}


def test_a_weight_that_underflowed_to_zero_lands_in_the_lowest_bin() -> None:
    w = apply_weight_mode(torch.tensor([-1e6, float("inf")], dtype=torch.float64), "none")
    assert log_weight_histogram(w) == {HIST_LO: 1, HIST_HI - 1: 1}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-60, 60, allow_nan=False), min_size=1, max_size=64))
def test_every_weight_counted_once_in_its_unit_bin(values: list[float]) -> None:
    w = apply_weight_mode(torch.tensor(values, dtype=torch.float64), "truncate", cap=2.0)
    hist = log_weight_histogram(w)
    assert sum(hist.values()) == len(values)
    assert all(HIST_LO <= edge < HIST_HI for edge in hist)
    want: dict[int, int] = {}
    for raw in w.raw.tolist():  # binned from the raw weights' own logs (no 1-ulp disagreement)
        lw = math.log(raw) if raw > 0 else -math.inf
        edge = HIST_LO if lw == -math.inf else min(max(math.floor(lw), HIST_LO), HIST_HI - 1)
        want[edge] = want.get(edge, 0) + 1
    assert hist == want
