"""Every record a trainer builds keeps SEE's record rules: rounds of random rewards scored by
random sets of weighted reward functions (one of them the success reward) go through the
trainer's own scoring (`RewardSet`) and `round_records`, then through the validator SEE runs on
a Publish (`mutualrl.common.records`). A reward SEE could not hold is the reward function's
error, named, before anything is built."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mutualrl.common import bounds
from mutualrl.common.records import DEFAULT_LIMITS, validate_records
from mutualrl.trainer.config.task import RewardSpec
from mutualrl.trainer.data.rewards import Batch, RewardError, RewardSet
from mutualrl.trainer.data.tasks import Prompt
from mutualrl.trainer.engines.base import Sample
from mutualrl.trainer.sharing.exchange import round_records
from mutualrl.v1 import experience_pb2 as pb

# Reward function i returns the batch's column `r<i>`: the drawn values, through the real call.
FUNCTIONS = "\n".join(f"def f{i}(completions, r{i}, **kw):\n    return list(r{i})\n"
                      for i in range(4))
MOST = bounds.MAX_ABS_REWARD
reward = st.one_of(st.floats(-1.0, 1.0), st.floats(-MOST / 8, MOST / 8),
                   st.sampled_from([0.0, 1.0, -1.0, 1e-300]))


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rewards") / "drawn.py"
    path.write_text(FUNCTIONS)
    return path


def reward_set(path: Path, weights: list[float]) -> RewardSet:
    return RewardSet([RewardSpec(fn=f"{path}:f{i}", weight=w) for i, w in enumerate(weights)],
                     max_new_tokens=8)


def sample(text: str, truncated: bool) -> Sample:
    n = len(text) or 1
    return Sample(0, [3] * n, text, [(min(i, len(text)), min(i + 1, len(text)))
                                     for i in range(n)], [-0.5] * n,
                  "length" if truncated else "stop")


@st.composite
def rounds(draw: st.DrawFn) -> dict[str, Any]:
    n_fns = draw(st.integers(1, 4))
    prompts, group = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    n = prompts * group
    return {
        "weights": draw(st.lists(st.floats(-2.0, 2.0), min_size=n_fns, max_size=n_fns)),
        "success": draw(st.integers(0, n_fns - 1)),
        "values": [draw(st.lists(reward, min_size=n, max_size=n)) for _ in range(n_fns)],
        "truncated": draw(st.lists(st.booleans(), min_size=n, max_size=n)),
        "texts": draw(st.lists(st.text(min_size=0, max_size=6), min_size=n, max_size=n)),
        "prompts": prompts, "group": group,
        "tau": draw(st.sampled_from([0.0, 0.5, 1.0])),
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(r=rounds())
def test_records_built_from_any_rewards_pass_see_validation(reward_file: Path,
                                                            r: dict[str, Any]) -> None:
    rs = reward_set(reward_file, r["weights"])
    batch = Batch(prompts=[""] * len(r["texts"]), completions=r["texts"],
                  completion_ids=[[3]] * len(r["texts"]), truncated=r["truncated"],
                  columns={f"r{i}": v for i, v in enumerate(r["values"])})
    total, per = rs.score(batch)
    label = rs.specs[r["success"]].label
    gate = [0.0 if t else v for v, t in zip(per[label], r["truncated"], strict=True)]
    # (a task may call a cut sample correct: the records must still keep SEE's rules)
    ok = [g >= r["tau"] for g in gate]
    g = r["group"]

    def rows(xs: list[Any]) -> list[list[Any]]:
        return [xs[i:i + g] for i in range(0, len(xs), g)]

    prompts = [Prompt(id=f"p{i}", skill="s", text=f"q{i}", answer="1")
               for i in range(r["prompts"])]
    samples = rows([sample(t, tr) for t, tr in zip(r["texts"], r["truncated"], strict=True)])
    run = pb.RunConfig(run_id="run", policies=["a", "b"], tau=r["tau"])
    for success in (rows(gate), None):  # a success reward of its own, or the sum itself
        records = round_records("run", "a", 3, 3, "run/a", prompts, samples, rows(total),
                                rows(ok), r["tau"], None, success=success)
        validate_records(records, run, DEFAULT_LIMITS)  # SEE's own check: no error
        stats = [x.stats for x in records if x.kind == pb.REWARD_STATS]
        assert len(stats) == r["prompts"]
        for s, row, gates in zip(stats, rows(total), rows(gate), strict=True):
            assert (s.count, s.max) == (len(row), max(row))
            assert s.success_max == (max(gates) if success is not None else 0.0)
            assert s.HasField("success_max") == (success is not None)


@pytest.mark.parametrize("value", [2e9, -1e10])
def test_a_reward_beyond_the_bounds_names_its_function(reward_file: Path, value: float) -> None:
    rs = reward_set(reward_file, [1.0, 0.5])
    batch = Batch(prompts=["", ""], completions=["a", "b"], completion_ids=[[1], [2]],
                  truncated=[False, False], columns={"r0": [0.0, 1.0], "r1": [value, 0.0]})
    with pytest.raises(RewardError, match=r"task.rewards\[f1\]: returned .*beyond"):
        rs.score(batch)


def test_a_weighted_total_beyond_the_bounds_names_the_weights(reward_file: Path) -> None:
    rs = reward_set(reward_file, [1.0, 1.0])
    batch = Batch(prompts=[""], completions=["a"], completion_ids=[[1]], truncated=[False],
                  columns={"r0": [MOST * 0.75], "r1": [MOST * 0.75]})
    with pytest.raises(RewardError, match=r"weighted total \(1 x f0 \+ 1 x f1\)"):
        rs.score(batch)
