"""The round-time breakdown `bench rounds --probes` reports, and `bench rollout`'s matmul
bound."""

from __future__ import annotations

import pytest

from mutualrl.bench.probes import mean_split
from mutualrl.bench.rollout import matmul_bound
from mutualrl.bench.rounds import round_split


def test_round_split_averages_the_parts_and_leaves_the_rest_to_the_update() -> None:
    rows = [
        {"step_s": 1.0, "rollout_s": 0.25, "probe_s": 0.125, "diag_s": 0.0, "tokens": 100.0},
        {"step_s": 2.0, "rollout_s": 0.75, "probe_s": 0.125, "diag_s": 0.5, "tokens": 300.0},
    ]
    split = round_split(rows)
    assert split == {"step_s": 1.5, "rollout_s": 0.5, "probe_s": 0.125, "diag_s": 0.25,
                     "update_s": 0.625, "loss_tokens": 200.0}


def test_round_split_of_no_rounds_is_zero() -> None:
    assert round_split([]) == dict.fromkeys(
        ("step_s", "rollout_s", "probe_s", "diag_s", "update_s", "loss_tokens"), 0.0)


def test_mean_split_averages_over_policies() -> None:
    a = {"step_s": 1.0, "loss_tokens": 10.0}
    b = {"step_s": 3.0, "loss_tokens": 30.0}
    assert mean_split({"a": a, "b": b}) == {"step_s": 2.0, "loss_tokens": 20.0}


def test_matmul_bound_is_sequences_over_the_step_time() -> None:
    got = matmul_bound(sequences=4, repeats=1)
    assert got["matmul_step_s"] > 0
    assert got["matmul_bound_tokens_per_s"] == pytest.approx(4 / got["matmul_step_s"])
    assert 0.0 < got["lm_head_share"] < 1.0
