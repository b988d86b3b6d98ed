"""The rollout worker's settings: validation naming the field, MWRA's grant read by `auto`, and
the round's threads split between the learner and the worker."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from mutualrl.trainer.config.run import GRPOSettings, PolicySettings
from mutualrl.trainer.runtime.allocator import RoundAllocation
from mutualrl.trainer.runtime.rollouts import Rollouts


def test_bad_settings_name_their_field() -> None:
    with pytest.raises(ValidationError, match="max_off_policy_steps"):
        GRPOSettings(max_off_policy_steps=-1)
    with pytest.raises(ValidationError, match="off_policy_cap"):
        GRPOSettings(off_policy_cap=0.5)
    with pytest.raises(ValidationError, match="off_policy_correction"):
        GRPOSettings(off_policy_correction="vtrace")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="rollout_worker"):
        PolicySettings(name="a", preset="llama-char", rollout_worker="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="rollout_worker with nproc > 1"):
        PolicySettings(name="a", preset="llama-char", rollout_worker=True, nproc=2)


def _rollouts(worker: bool | str, d: int) -> Rollouts:
    return Rollouts(torch.nn.Linear(1, 1), d, rounds=4, worker=worker)


def test_auto_follows_mwras_grant() -> None:
    granted = RoundAllocation(threads=2, rollout_budget=8, rollout_workers=1)
    none = RoundAllocation(threads=2, rollout_budget=8)
    assert _rollouts("auto", 1).uses_worker(granted)
    assert not _rollouts("auto", 1).uses_worker(none)
    assert _rollouts(True, 1).uses_worker(none)
    assert not _rollouts(False, 1).uses_worker(granted)


def test_threads_split_between_learner_and_worker() -> None:
    r = _rollouts(True, 1)
    assert r.threads(RoundAllocation(threads=2, rollout_budget=8)) == (1, 1)
    assert r.threads(RoundAllocation(threads=8, rollout_budget=8)) == (4, 4)
    assert r.threads(RoundAllocation(threads=8, rollout_budget=8, rollout_threads=6)) == (2, 6)
    assert r.threads(RoundAllocation(threads=8, rollout_budget=8, rollout_threads=9)) == (1, 7)
    assert r.threads(RoundAllocation(threads=1, rollout_budget=8)) == (1, 1)
    # no overlap (d = 0, or rollouts in-process): both may use every thread
    assert _rollouts(True, 0).threads(RoundAllocation(threads=4, rollout_budget=8)) == (4, 4)
    assert _rollouts(False, 1).threads(RoundAllocation(threads=4, rollout_budget=8)) == (4, 4)
