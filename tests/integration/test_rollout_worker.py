"""Rollouts in a worker process of the policy's own (runtime.rollouts): with d = 0 the run is
the in-process run bit for bit; with d = 1 in the deterministic mode a seed replays bit for bit
and round k samples version k - 1; a rollout older than the bound is refused and regenerated;
a worker killed wherever the learner waits on it costs a restart, never a hang (one that keeps
dying fails the run), and so does one stopped (no heartbeat); in the asynchronous mode the
update takes an idle worker's threads.
Real worker processes (torch.multiprocessing, spawn) on a tiny preset, services local."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from mutualrl.trainer.config.run import TrainerConfig
from mutualrl.trainer.runtime.allocator import RoundAllocation
from mutualrl.trainer.runtime.loop import train
from mutualrl.trainer.runtime.rollouts import MAX_DEATHS_IN_A_ROW, RolloutBatch
from mutualrl.trainer.runtime.session import Session, build_session

ROUNDS = 3


@pytest.fixture(scope="module")
def presets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("presets")


def config(out: Path, worker: bool, d: int, mode: str = "deterministic",
           stall_s: float = 60.0, task: dict[str, Any] | None = None,
           **grpo: Any) -> TrainerConfig:
    return TrainerConfig.model_validate({
        **({"task": task} if task else {}),
        "run_id": "rw", "output_dir": str(out), "seed": 3, "services": {"local": True},
        "exchange": {"mode": mode},
        "grpo": {"group_size": 4, "prompts_per_round": 2, "rounds": ROUNDS,
                 "max_new_tokens": 6, "max_off_policy_steps": d, "lr": 1e-2,
                 # a gradient every round, whatever the (untrained) policy's rewards
                 "entropy_coef": 0.1, **grpo},
        "eval": {"every": 0}, "checkpoint": {"every": 0},
        "metrics": {"tensorboard": False, "progress": False},
        "policies": [{"name": "A", "preset": "llama-char", "threads": 1,
                      "rollout_worker": worker, "rollout_worker_stall_s": stall_s}]})


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


def test_the_correction_in_the_updates_forward_is_the_separate_pass(
        tmp_path: Path, presets: Path) -> None:
    """With one update a round, truncated IS takes the current log-probs from the update's
    own forward; masking keeps a scoring pass of its own. With a cap no ratio reaches, both
    weigh each token by r, so the two paths train the same weights (to float rounding)."""
    # a format reward gives the untrained policy's groups reward variance: advantages != 0
    task = {"regime": "short", "skills": ["add", "rev"], "format_reward": 0.5}
    fused, m1 = run(tmp_path / "tis", presets, worker=True, d=1, task=task, rounds=5,
                    off_policy_correction="tis", off_policy_cap=1e9)
    scored, m2 = run(tmp_path / "mis", presets, worker=True, d=1, task=task, rounds=5,
                     off_policy_correction="mis", off_policy_cap=1e9)
    for n in fused:
        torch.testing.assert_close(fused[n], scored[n], rtol=0, atol=1e-5)
    for a, b in zip(m1[1:], m2[1:], strict=True):
        assert a["offpolicy/ratio_mean"] != 1.0
        assert abs(a["offpolicy/ratio_mean"] - b["offpolicy/ratio_mean"]) < 1e-5
        assert a["offpolicy/truncated"] == b["offpolicy/truncated"] == 0.0
        # the weights reach the loss (AdamW's step hides a small rescaling of the gradient)
        assert a["loss_pg"] == pytest.approx(b["loss_pg"], rel=1e-5, abs=1e-7)
    assert sum(r["loss_pg"] != 0.0 for r in m1[1:]) >= 2


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


def _publish_within(s: Session, version: int, seconds: float) -> None:
    """`publish` in a thread: a learner that would wait forever fails the test instead."""
    done = threading.Thread(target=s.rollouts.publish, args=(s, version), daemon=True)
    done.start()
    done.join(seconds)
    assert not done.is_alive(), f"publishing version {version} hung on a dead worker"


def _kill(s: Session) -> None:
    assert s.rollouts.worker is not None
    pid = s.rollouts.worker.pid
    os.kill(pid, signal.SIGKILL)
    s.rollouts.worker.proc.join(10)


def test_a_worker_killed_while_it_waits_for_weights_costs_a_restart(
        tmp_path: Path, presets: Path) -> None:
    """Killed while it waits for a version the learner has not published yet: the learner
    publishes it, and the next round comes from a new worker."""
    s: Session = build_session(config(tmp_path, worker=True, d=1, rounds=8), "A", cache_dir=presets)
    try:
        alloc = RoundAllocation(threads=1, rollout_budget=8)
        s.rollouts.take(0, alloc, s)  # requests round 1 (version 0) too
        s.rollouts.publish(s, 1)
        s.rollouts.take(1, alloc, s)  # requests round 2: version 1
        s.rollouts.publish(s, 2)
        s.rollouts.take(2, alloc, s)  # requests round 3: version 2
        # round 4 asks for version 3, which is not published: the worker waits for it
        s.rollouts.take(3, alloc, s)
        time.sleep(1.0)
        _kill(s)
        _publish_within(s, 3, 30.0)
        got = s.rollouts.take(4, alloc, s)
        assert got.version == 3 and s.rollouts.worker is not None
        assert s.rollouts.worker.restarts == 1
    finally:
        s.close()


def test_a_worker_killed_before_it_loads_a_round_does_not_stall_the_publish(
        tmp_path: Path, presets: Path) -> None:
    """Killed with a round requested whose weights it never loaded: publishing the version
    that overwrites them waits for that load, so the learner starts a new worker to do it."""
    s: Session = build_session(config(tmp_path, worker=True, d=1, rounds=8), "A", cache_dir=presets)
    try:
        alloc = RoundAllocation(threads=1, rollout_budget=8)
        s.rollouts.take(0, alloc, s)
        s.rollouts.publish(s, 1)
        s.rollouts.take(1, alloc, s)
        s.rollouts.take(2, alloc, s)  # round 3 asks for version 2: not published yet
        time.sleep(1.0)
        _kill(s)
        _publish_within(s, 2, 30.0)
        _publish_within(s, 3, 60.0)  # overwrites version 2 only once round 3 has loaded it
        assert s.rollouts.worker is not None and s.rollouts.worker.restarts == 1
        assert s.rollouts.take(3, alloc, s).version == 2
    finally:
        s.close()


def test_a_stopped_worker_is_restarted_after_its_heartbeat_stops(
        tmp_path: Path, presets: Path) -> None:
    """SIGSTOPped while the learner waits for a round: alive, but no heartbeat for stall_s, so
    the learner kills it and the round comes from a new worker."""
    s: Session = build_session(config(tmp_path, worker=True, d=1, rounds=8, stall_s=2.0), "A",
                               cache_dir=presets)
    try:
        alloc = RoundAllocation(threads=1, rollout_budget=8)
        s.rollouts.take(0, alloc, s)  # requests round 1 (version 0) too
        w = s.rollouts.worker
        assert w is not None
        os.kill(w.pid, signal.SIGSTOP)
        got: list[RolloutBatch] = []
        taking = threading.Thread(target=lambda: got.append(s.rollouts.take(1, alloc, s)),
                                  daemon=True)
        taking.start()
        taking.join(60.0)
        assert not taking.is_alive(), "the learner hung on a stopped worker"
        assert got and got[0].version == 0
        assert (w.stalls, w.restarts) == (1, 1)
        assert got[0].stats["stalls"] == 1.0
    finally:
        s.close()


def test_a_worker_that_keeps_dying_fails_the_run(tmp_path: Path, presets: Path) -> None:
    """Killed again as soon as each new one starts: the learner gives up after
    MAX_DEATHS_IN_A_ROW deaths with no result, naming the worker, instead of looping."""
    s: Session = build_session(config(tmp_path, worker=True, d=1, rounds=8), "A",
                               cache_dir=presets)
    stop = threading.Event()

    def kill_each() -> None:
        while not stop.is_set():
            w = s.rollouts.worker
            if w is not None and w.proc is not None and w.proc.is_alive():
                os.kill(w.pid, signal.SIGKILL)
            time.sleep(0.05)

    killer = threading.Thread(target=kill_each, daemon=True)
    killer.start()
    try:
        with pytest.raises(RuntimeError, match=f"died {MAX_DEATHS_IN_A_ROW} times in a row"):
            s.rollouts.take(0, RoundAllocation(threads=1, rollout_budget=8), s)
    finally:
        stop.set()
        killer.join()
        s.close()


def _forward_backward(s: Session) -> None:
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    s.model(input_ids=ids).logits.sum().backward()
    s.model.zero_grad(set_to_none=True)


@pytest.mark.parametrize("mode", ["asynchronous", "deterministic"])
def test_the_update_takes_an_idle_workers_threads_and_gives_them_back(
        tmp_path: Path, presets: Path, mode: str) -> None:
    """Asynchronous mode, two threads: the learner keeps one while the worker samples and takes
    both between two layers once it waits; the deterministic mode keeps the split fixed."""
    cfg = config(tmp_path, worker=True, d=1, mode=mode, rounds=8)
    cfg.policies[0].threads = 2
    s: Session = build_session(cfg, "A", cache_dir=presets)
    try:
        alloc = RoundAllocation(threads=2, rollout_budget=8)
        assert s.rollouts.set_threads(alloc) == (1, 1) and torch.get_num_threads() == 1
        s.rollouts.take(0, alloc, s)
        s.rollouts.settle()  # round 1 is sampled: the worker waits
        assert s.rollouts.worker is not None
        shared = s.rollouts.worker.shared
        assert int(shared.sampling[0]) == 0
        _forward_backward(s)
        assert torch.get_num_threads() == (2 if mode == "asynchronous" else 1)
        shared.sampling[0] = 1  # as the worker marks a job it samples
        _forward_backward(s)
        assert torch.get_num_threads() == 1
    finally:
        s.close()
        torch.set_num_threads(1)
