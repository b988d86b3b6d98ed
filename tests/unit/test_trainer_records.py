"""Every record a trainer builds keeps SEE's record rules: rounds drawn over every field the
loop passes to `round_records` (token ids, log-probs, character offsets of any text, finish
reasons with and without a final EOS token, `eos_token_id`, the sender's renderings of any
length, prompts' ids, skills and texts, rounds and policy versions up to their bounds) and
rewards, None and non-finite ones included, from random sets of weighted reward functions (one
of them the success reward) scored by the trainer's own `RewardSet`, go through `round_records`
and then through the validator SEE runs on a Publish (`mutualrl.common.records`); what each
record carries is what was drawn. A reward SEE could not hold is the reward function's error,
named, before anything is built."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mutualrl.common import bounds
from mutualrl.common import token_arrays as ta
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
# What a reward function may return for a sample: None and non-finite values score 0.
reward = st.one_of(st.floats(-1.0, 1.0), st.floats(-MOST / 8, MOST / 8),
                   st.sampled_from([0.0, 1.0, -1.0, 1e-300, None, math.nan, math.inf,
                                    -math.inf]))
# An engine's behaviour log-prob: a finite float32 (log_softmax), as small as float32 goes.
logprob = st.floats(max_value=0.0, width=32, allow_nan=False, allow_infinity=False)
# Problem ids: a hash of the problem (the default) or a table's id column.
prompt_id = st.one_of(st.text("0123456789abcdef", min_size=16, max_size=16),
                      st.text(st.characters(exclude_categories=("Cc", "Cs"),
                                            exclude_characters="|"), min_size=1, max_size=40))
RENDER_CHARS = 1024  # SEE's default limit on a meta value


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rewards") / "drawn.py"
    path.write_text(FUNCTIONS)
    return path


def reward_set(path: Path, weights: list[float]) -> RewardSet:
    return RewardSet([RewardSpec(fn=f"{path}:f{i}", weight=w) for i, w in enumerate(weights)],
                     max_new_tokens=8)


@st.composite
def samples(draw: st.DrawFn, eos: int | None) -> Sample:
    """A completion as an engine gives it: tokens with their log-probs and character spans in
    the decoded text (zero-width ones too: special tokens, bytes of a later character), ending
    with the EOS token or not, stopped or cut."""
    text = draw(st.text(max_size=12))
    n = draw(st.integers(1, 8))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), min_size=n + 1, max_size=n + 1)))
    offsets = [(cuts[i], cuts[i + 1]) for i in range(n)]
    ids = draw(st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n))
    if eos is not None and draw(st.booleans()):
        ids[-1] = eos
    return Sample(0, ids, text, offsets, draw(st.lists(logprob, min_size=n, max_size=n)),
                  draw(st.sampled_from(["stop", "length"])))


@st.composite
def rounds(draw: st.DrawFn) -> dict[str, Any]:
    n_fns = draw(st.integers(1, 4))
    prompts, group = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    n = prompts * group
    eos = draw(st.one_of(st.none(), st.integers(0, 2**31 - 1)))
    # renderings up to and past SEE's limit, built by repetition (cheap to draw)
    around_limit = st.tuples(st.text(min_size=1, max_size=8),
                             st.integers(RENDER_CHARS - 2, RENDER_CHARS + 40)).map(
        lambda x: (x[0] * (x[1] // len(x[0]) + 1))[:x[1]])
    rendering = st.one_of(st.none(), st.text(max_size=8), around_limit)
    return {
        "weights": draw(st.lists(st.floats(-2.0, 2.0), min_size=n_fns, max_size=n_fns)),
        "success": draw(st.integers(0, n_fns - 1)),
        "values": [draw(st.lists(reward, min_size=n, max_size=n)) for _ in range(n_fns)],
        "samples": draw(st.lists(samples(eos), min_size=n, max_size=n)),
        "eos": eos,
        "ids": draw(st.lists(prompt_id, min_size=prompts, max_size=prompts, unique=True)),
        "skills": draw(st.lists(st.text(min_size=1, max_size=12), min_size=prompts,
                                max_size=prompts)),
        "texts": draw(st.lists(st.text(max_size=200), min_size=prompts, max_size=prompts)),
        "renderings": draw(st.one_of(st.none(), st.lists(rendering, min_size=prompts,
                                                         max_size=prompts))),
        "round": draw(st.integers(0, bounds.MAX_ROUND)),
        "prompts": prompts, "group": group,
        "tau": draw(st.sampled_from([0.0, 0.5, 1.0])),
    }


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(r=rounds())
def test_records_built_from_any_round_pass_see_validation(reward_file: Path,
                                                          r: dict[str, Any]) -> None:
    """Catches a record SEE refuses built from what the loop passes (planted: `RewardSet`
    keeping a non-finite reward, "records[0].reward: not finite"; `round_records` keeping a
    rendering past SEE's 1024 characters, "records[0].meta[rendered_prompt]: ... longer than
    1024 characters") and a record that carries other values than the sample's (planted: the
    EOS finish taken for any last token)."""
    rs = reward_set(reward_file, r["weights"])
    flat: list[Sample] = r["samples"]
    truncated = [s.finish_reason == "length" for s in flat]
    batch = Batch(prompts=[""] * len(flat), completions=[s.text for s in flat],
                  completion_ids=[s.token_ids for s in flat], truncated=truncated,
                  columns={f"r{i}": v for i, v in enumerate(r["values"])})
    total, per = rs.score(batch)
    assert all(math.isfinite(t) for t in total)
    label = rs.specs[r["success"]].label
    gate = [0.0 if t else v for v, t in zip(per[label], truncated, strict=True)]
    # (a task may call a cut sample correct: the records must still keep SEE's rules)
    ok = [g >= r["tau"] for g in gate]
    g = r["group"]

    def rows(xs: list[Any]) -> list[list[Any]]:
        return [xs[i:i + g] for i in range(0, len(xs), g)]

    prompts = [Prompt(id=i, skill=sk, text=t, answer="1")
               for i, sk, t in zip(r["ids"], r["skills"], r["texts"], strict=True)]
    run = pb.RunConfig(run_id="run", policies=["a", "b"], tau=r["tau"])
    k = r["round"]
    for success in (rows(gate), None):  # a success reward of its own, or the sum itself
        records = round_records("run", "a", k, k, "run/a", prompts, rows(flat), rows(total),
                                rows(ok), r["tau"], r["eos"], success=success,
                                renderings=r["renderings"])
        validate_records(records, run, DEFAULT_LIMITS)  # SEE's own check: no error
        stats = [x.stats for x in records if x.kind == pb.REWARD_STATS]
        assert len(stats) == r["prompts"]
        for s, row, gates in zip(stats, rows(total), rows(gate), strict=True):
            assert (s.count, s.max) == (len(row), max(row))
            assert s.success_max == (max(gates) if success is not None else 0.0)
            assert s.HasField("success_max") == (success is not None)
        rollouts = [x for x in records if x.kind == pb.ROLLOUT]
        assert len(rollouts) == len(flat)
        for i, (rec, smp) in enumerate(zip(rollouts, flat, strict=True)):
            p = i // g
            assert (rec.prompt_id, rec.prompt_text, rec.round, rec.policy_version) == \
                (r["ids"][p], r["texts"][p], k, k)
            assert rec.text == smp.text and rec.reward == total[i]
            assert ta.token_ids(rec).tolist() == smp.token_ids
            assert ta.offset_starts(rec).tolist() == [a for a, _ in smp.offsets]
            assert ta.offset_ends(rec).tolist() == [b for _, b in smp.offsets]
            assert ta.logprobs(rec).tolist() == smp.logprobs  # float32 values, exactly
            eos = (smp.finish_reason == "stop" and r["eos"] is not None
                   and smp.token_ids[-1] == r["eos"])
            assert rec.finish_reason == (pb.FINISH_REASON_EOS if eos else
                                         pb.FINISH_REASON_STOP if smp.finish_reason == "stop"
                                         else pb.FINISH_REASON_LENGTH)
            shown = (r["renderings"] or [None] * r["prompts"])[p]
            got = rec.meta.get("rendered_prompt")
            if not shown:
                assert got is None
            elif len(shown) <= RENDER_CHARS:
                assert got == shown
            else:
                assert got == shown[:RENDER_CHARS - 1] + "\u2026"


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
