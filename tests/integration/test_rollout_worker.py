"""Rollouts in a worker process of the policy's own (runtime.rollouts): with d = 0 the run is
the in-process run bit for bit; with d = 1 in the deterministic mode a seed replays bit for bit
and round k samples version k - 1; a rollout older than the bound is refused and regenerated.
Real worker processes (torch.multiprocessing, spawn) on a tiny preset, services local."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from mutualrl.trainer.config.run import TrainerConfig
from mutualrl.trainer.runtime.allocator import RoundAllocation
from mutualrl.trainer.runtime.loop import train
from mutualrl.trainer.runtime.rollouts import RolloutBatch
from mutualrl.trainer.runtime.session import Session, build_session

ROUNDS = 3


@pytest.fixture(scope="module")
def presets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("presets")


def config(out: Path, worker: bool, d: int, mode: str = "deterministic",
           **grpo: Any) -> TrainerConfig:
    return TrainerConfig.model_validate({
        "run_id": "rw", "output_dir": str(out), "seed": 3, "services": {"local": True},
        "exchange": {"mode": mode},
        "grpo": {"group_size": 4, "prompts_per_round": 2, "rounds": ROUNDS,
                 "max_new_tokens": 6, "max_off_policy_steps": d, "lr": 1e-2,
                 # a gradient every round, whatever the (untrained) policy's rewards
                 "entropy_coef": 0.1, **grpo},
        "eval": {"every": 0}, "checkpoint": {"every": 0},
        "metrics": {"tensorboard": False, "progress": False},
        "policies": [{"name": "A", "preset": "llama-char", "threads": 1,
                      "rollout_worker": worker}]})


def run(out: Path, presets: Path, worker: bool, d: int, **grpo: Any
        ) -> tuple[dict[str, torch.Tensor], list[dict[str, float]]]:
    s = build_session(config(out, worker, d, **grpo), "A", cache_dir=presets)
    try:
        train(s)
    finally:
        s.close()
    params = {n: p.detach().clone() for n, p in s.model.named_parameters()}
    rows = [json.loads(x) for x in (s.run_dir / "metrics.jsonl").read_text().splitlines()]
    return params, rows


VOLATILE = ("time", "_s", "tokens_per_s", "peak_rss_mib", "rollout/")
WHERE = ("rollout_workers", "rollout_threads")
"""Where the rollouts ran: what the two runs compared differ in by design."""


def stable(rows: list[dict[str, float]]) -> list[dict[str, float]]:
    """The rows without timings and engine counters (which differ between any two runs)."""
    return [{k: v for k, v in r.items() if not any(x in k for x in VOLATILE) and k not in WHERE}
            for r in rows]


def test_d0_worker_is_the_in_process_run_bit_for_bit(tmp_path: Path, presets: Path) -> None:
    p_in, m_in = run(tmp_path / "in", presets, worker=False, d=0)
    p_w, m_w = run(tmp_path / "w", presets, worker=True, d=0)
    assert all(r["grad_norm"] > 0 for r in m_in)  # every round moved the weights
    assert all(torch.equal(p_in[n], p_w[n]) for n in p_in)
    assert stable(m_in) == stable(m_w)
    assert [r["policy_version"] for r in m_w] == [0.0, 1.0, 2.0]
    assert [r["off_policy_lag"] for r in m_w] == [0.0, 0.0, 0.0]
    assert m_in[-1]["reward_mean"] == m_w[-1]["reward_mean"]


def test_d1_deterministic_replays_bit_for_bit(tmp_path: Path, presets: Path) -> None:
    p1, m1 = run(tmp_path / "a", presets, worker=True, d=1)
    p2, m2 = run(tmp_path / "b", presets, worker=True, d=1)
    assert all(torch.equal(p1[n], p2[n]) for n in p1)
    assert stable(m1) == stable(m2)
    # round k samples exactly version k - 1 (round 0 the start), and the lag is corrected
    assert [r["policy_version"] for r in m1] == [0.0, 0.0, 1.0]
    assert [r["off_policy_lag"] for r in m1] == [0.0, 1.0, 1.0]
    assert "offpolicy/ratio_mean" in m1[1] and "offpolicy/ratio_mean" not in m1[0]
    # and it is not the on-policy run: the lag changed what was trained on
    p0, _ = run(tmp_path / "c", presets, worker=True, d=0)
    assert any(not torch.equal(p0[n], p1[n]) for n in p0)


def test_a_rollout_older_than_the_bound_is_refused(tmp_path: Path, presets: Path) -> None:
    s: Session = build_session(config(tmp_path, worker=True, d=1), "A", cache_dir=presets)
    try:
        alloc = RoundAllocation(threads=1, rollout_budget=8)
        for k in range(2):  # versions 0, 1 published; round 2 may use >= 1
            s.rollouts.take(k, alloc, s)
            s.rollouts.publish(s, k + 1)
        real = s.rollout_request(2, alloc)
        planted = RolloutBatch(real.prompts, [[] for _ in real.prompts], version=0,
                               generate_s=0.0, wait_s=0.0)
        s.rollouts.planted[2] = planted
        got = s.rollouts.take(2, alloc, s)
        assert s.rollouts.refused == 1
        assert got is not planted and got.version >= 1
        assert all(len(row) == 4 for row in got.samples)
    finally:
        s.close()
