"""Reward functions: math-verify where string rules fail, TRL's call signature for the user's
own, failures scored 0 and counted, wrong lengths and bad imports named, the call timeout, and
verified success as the one named reward reaching tau."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from chat_policies import write_problems

from mutualrl.trainer.config.task import BUILTIN_REWARDS, DatasetTaskConfig, RewardSpec
from mutualrl.trainer.data.answers import answers_match
from mutualrl.trainer.data.dataset_task import DatasetTask
from mutualrl.trainer.data.rewards import (
    BUILTINS,
    Batch,
    RewardError,
    RewardSet,
    boxed_format,
    final_number,
    math_verify,
    overlong,
)

# (reference, completion): equal answers that the string-and-rational rules of answers.py miss.
EQUIVALENT = [
    ("\\frac{\\sqrt{2}}{2}", "so the answer is $\\sqrt{2}/2$"),
    ("\\frac{\\pi}{2}", "\\boxed{\\pi/2}"),
    ("(1,2]", "\\boxed{(1,1.5] \\cup (1.5,2]}"),  # intervals
    ("\\{1,2,3\\}", "\\boxed{\\{3,2,1\\}}"),  # sets
    ("x^2+2x+1", "\\boxed{(x+1)^2}"),
]
DIFFERENT = [("(1,2]", "\\boxed{[1,2]}"), ("\\{1,2\\}", "\\boxed{\\{1,3\\}}"),
             ("\\frac{1}{2}", "\\boxed{2}")]


def test_the_config_knows_every_built_in_reward() -> None:
    """`task.rewards[].fn` is validated against the config's list of built-ins, without
    importing the reward functions: the list and the functions name the same set."""
    assert set(BUILTIN_REWARDS) == set(BUILTINS)
    with pytest.raises(ValueError, match="neither a built-in"):
        RewardSpec(fn="no_such_reward")


@pytest.mark.parametrize(("ref", "completion"), EQUIVALENT)
def test_math_verify_accepts_what_string_rules_miss(ref: str, completion: str) -> None:
    from math_verify import parse, verify

    from mutualrl.trainer.data.answers import last_boxed

    got = last_boxed(completion) or completion
    assert not answers_match(got, ref)  # today's rules get it wrong
    assert math_verify([completion], [ref]) == [1.0]
    assert verify(parse(f"${ref}$"), parse(completion))  # as math-verify itself says


@pytest.mark.parametrize(("ref", "completion"), DIFFERENT)
def test_math_verify_rejects_different_answers(ref: str, completion: str) -> None:
    from math_verify import parse, verify

    assert math_verify([completion], [ref]) == [0.0]
    assert not verify(parse(f"${ref}$"), parse(completion))


def test_builtins() -> None:
    assert math_verify(["\\boxed{7}"], ["7"], truncated=[True]) == [0.0]
    assert math_verify([[{"role": "assistant", "content": "\\boxed{7}"}]], ["7"]) == [1.0]
    assert boxed_format(["\\boxed{3}", "3", "\\boxed{"]) == [1.0, 0.0, 0.0]
    assert final_number(["so #### 1,000", "it is 12 then 13", "x"], ["1000", "13", "1"]) == \
        [1.0, 1.0, 0.0]
    # DAPO: 0 up to max - buffer, then linear to -1 at max, -1 beyond.
    assert overlong([[0] * n for n in (6, 8, 9, 10, 12)], max_tokens=10, buffer_tokens=4) == \
        [0.0, -0.5, -0.75, -1.0, -1.0]


def _batch(completions: list[str], **cols: list[Any]) -> Batch:
    n = len(completions)
    return Batch(prompts=["q"] * n, completions=completions, completion_ids=[[1]] * n,
                 truncated=[False] * n,
                 columns={"reference_answer": ["1"] * n, **cols})


def test_a_file_reward_gets_trl_kwargs_and_its_failures_score_zero(tmp_path: Path) -> None:
    path = tmp_path / "my_rewards.py"
    path.write_text(
        "def picky(prompts, completions, completion_ids, level, **kwargs):\n"
        "    assert kwargs['reference_answer'] and kwargs['truncated'] is not None\n"
        "    out = []\n"
        "    for c, lv in zip(completions, level):\n"
        "        if c == 'boom':\n"
        "            raise ValueError('cannot score')\n"
        "        out.append(float(lv) if c == 'ok' else None)\n"
        "    return out\n"
        "def short(completions, **kw):\n"
        "    return [1.0]\n")
    rs = RewardSet([RewardSpec(fn=f"{path}:picky", weight=2.0)], 8)
    total, per = rs.score(_batch(["ok", "boom", "x"], level=[3, 4, 5]))
    assert per["picky"] == [3.0, 0.0, 0.0] and total == [6.0, 0.0, 0.0]  # None counts 0
    assert rs.errors == {"picky": 1}
    short = RewardSet([RewardSpec(fn=f"{path}:short", name="brief")], 8)
    with pytest.raises(RewardError, match=r"task.rewards\[brief\]: returned 1 values for 2"):
        short.score(_batch(["a", "b"]))


def test_rewards_that_cannot_load_are_named(tmp_path: Path) -> None:
    with pytest.raises(RewardError, match=r"task.rewards\[f\].fn: cannot import .*nope.py"):
        RewardSet([RewardSpec(fn=f"{tmp_path}/nope.py:f")], 8)
    with pytest.raises(RewardError, match=r"cannot import 'no_such_module_x'"):
        RewardSet([RewardSpec(fn="no_such_module_x:f")], 8)
    with pytest.raises(RewardError, match=r"has no callable 'missing'"):
        RewardSet([RewardSpec(fn="math:missing")], 8)
    with pytest.raises(ValueError, match="neither a built-in"):
        RewardSpec(fn="math_verified")
    with pytest.raises(RewardError, match="names must be unique"):
        RewardSet([RewardSpec(fn="math_verify"), RewardSpec(fn="math_verify")], 8)


def test_a_call_past_its_timeout_scores_zero(tmp_path: Path) -> None:
    path = tmp_path / "slow.py"
    path.write_text("import time\n"
                    "def slow(completions, **kw):\n"
                    "    if 'stuck' in completions:\n"
                    "        time.sleep(3)\n"
                    "    return [1.0] * len(completions)\n")
    rs = RewardSet([RewardSpec(fn=f"{path}:slow")], 8, timeout_s=0.3)
    t0 = time.monotonic()
    _, per = rs.score(_batch(["a", "stuck", "b"]))
    assert per["slow"] == [1.0, 0.0, 1.0] and rs.errors == {"slow": 1}
    assert time.monotonic() - t0 < 2.0  # one batch timeout and one sample timeout


def test_verified_success_is_the_named_reward_not_the_sum(tmp_path: Path) -> None:
    path = write_problems(tmp_path / "t.parquet", 4)
    cfg = DatasetTaskConfig.model_validate({
        "dataset": {"path": str(path), "prompt_key": "query", "answer_key": "gold"},
        "rewards": [{"fn": "math_verify", "weight": 0.5},
                    {"fn": "overlong", "args": {"buffer_tokens": 2}, "weight": 1.0}],
        "max_new_tokens": 4, "success_reward": "math_verify"})
    task = DatasetTask(cfg)
    task.check_rewards()
    from mutualrl.trainer.engines.base import Sample

    p = task.problems[0]  # add:1+0= -> 1

    def y(text: str, n: int, reason: str = "stop") -> Sample:
        return Sample(0, [5] * n, text, [], [], reason)

    s = task.score([p], [[y("1", 1), y("1", 4), y("2", 1), y("1", 4, "length")]], tau=1.0)
    assert s.rewards[0] == [0.5, -0.5, 0.0, -1.0]
    assert s.correct[0] == [True, True, False, False]  # the sum is below tau, success is not
    assert s.success == [[1.0, 1.0, 0.0, 0.0]]
    assert s.stats["reward/math_verify"] == 0.5


def test_success_records_carry_the_success_reward() -> None:
    """A sample whose weighted sum is below tau but whose success reward reaches it is a
    VERIFIED_SUCCESS for SEE (its record carries the success reward, as SEE's tau check
    reads it); the stats' sums and max are the weighted sum's (SEE holds max >= mean), and
    their `success_max` (SGT's gate) is the success reward's."""
    from mutualrl.trainer.data.tasks import Prompt
    from mutualrl.trainer.engines.base import Sample
    from mutualrl.trainer.sharing.exchange import round_records
    from mutualrl.v1 import experience_pb2 as pb

    p = Prompt(id="p", skill="s", text="1+1?", answer="2")
    y = Sample(0, [5, 6], "2", [(0, 1), (1, 1)], [-0.1, -0.2], "stop")

    def records(success: list[list[float]] | None) -> list[Any]:
        return round_records("r", "a", 0, 0, "r/a", [p], [[y, y]], [[0.5, -0.2]],
                             [[True, False]], 1.0, None, success=success)

    out = records([[1.0, 0.0]])
    wins = [r for r in out if r.kind == pb.VERIFIED_SUCCESS]
    assert len(wins) == 1 and wins[0].reward == 1.0
    stats = next(r for r in out if r.kind == pb.REWARD_STATS).stats
    assert (stats.max, stats.success_max, stats.sum) == (0.5, 1.0, pytest.approx(0.3))
    assert [r.reward for r in out if r.kind == pb.ROLLOUT] == [0.5, pytest.approx(-0.2)]
    single = records(None)
    assert not [r for r in single if r.kind == pb.VERIFIED_SUCCESS]  # the sum's 0.5
    assert not next(r for r in single if r.kind == pb.REWARD_STATS).stats.HasField(
        "success_max")
