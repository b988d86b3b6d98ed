"""Synthetic tasks: determinism, disjoint splits, paired round order, SFT targets verify."""

from __future__ import annotations

import random

import pytest

from mutualrl.trainer.config.task import DEFAULT_SKILLS, SKILLS, TaskConfig
from mutualrl.trainer.data.tasks import (
    N_STYLES,
    Prompt,
    SyntheticTask,
    corpus,
    skill_mix,
    worked_steps,
)


def test_prompt_format_short_example() -> None:
    p = Prompt(id="add:37+58=", skill="add", text="add:37+58=", answer="95")
    assert SyntheticTask().sft_target(p, random.Random(0)) == "95;"
    assert SyntheticTask().reward(p, "95;", "stop") == 1.0


def test_worked_styles_match_notes() -> None:
    add = Prompt(id="add:37+58=", skill="add", text="add:37+58=", answer="95")
    assert [worked_steps(add, s) for s in range(3)] == [
        "7+8=15c1,3+5+1=9", "7+8=15,1+3+5=9", "30+50=80,7+8=15"]
    rev = Prompt(id="rev:3871=", skill="rev", text="rev:3871=", answer="1783")
    assert [worked_steps(rev, s) for s in range(3)] == ["1,7,8,3", "1.7.8.3", "17,83"]
    srt = Prompt(id="sort:5193=", skill="sort", text="sort:5193=", answer="1359")
    assert worked_steps(srt, 0) == "1,3,5,9" and worked_steps(srt, 2) == "5,15,159,1359"
    sub = Prompt(id="sub:91-46=", skill="sub", text="sub:91-46=", answer="45")
    assert worked_steps(sub, 0) == "1-6=5b1,9-4-1=4"
    assert worked_steps(sub, 1) == "91-40=51,51-6=45"
    mul = Prompt(id="mul:23*7=", skill="mul", text="mul:23*7=", answer="161")
    assert worked_steps(mul, 0) == "3*7=21c2,2*7+2=16c1"


def test_answers_are_correct() -> None:
    t = SyntheticTask(skills=list(SKILLS), digits={"add": 3, "rev": 5})
    for p in t.prompts("train", 200, seed=3):
        skill, body = p.text[:-1].split(":")
        if skill == "add":
            a, b = body.split("+")
            assert int(p.answer) == int(a) + int(b) and len(a) == 3
        elif skill == "sub":
            a, b = body.split("-")
            assert int(p.answer) == int(a) - int(b) >= 0
        elif skill == "mul":
            a, b = body.split("*")
            assert int(p.answer) == int(a) * int(b)
        elif skill == "rev":
            assert p.answer == body[::-1] and len(body) == 5
        else:
            assert p.answer == "".join(sorted(body))
        assert p.id == p.text


@pytest.mark.parametrize("regime", ["short", "worked"])
def test_every_sft_target_verifies(regime: str) -> None:
    t = SyntheticTask(regime=regime, skills=list(SKILLS))
    rng = random.Random(0)
    styles = set()
    for p in t.prompts("train", 300, seed=1):
        target = t.sft_target(p, rng)
        assert t.reward(p, target, "stop") == 1.0, (p, target)
        assert t.reward(p, target, "length") == 0.0
        styles.add(target.split(">")[0].count("."))
    if regime == "worked":
        # Steps differ between styles; at least two surface forms show up.
        assert len(styles) >= 2
        for p in t.prompts("heldout", 20):
            assert len({worked_steps(p, s) for s in range(N_STYLES)}) >= 2


def test_deterministic_across_instances() -> None:
    a, b = SyntheticTask(regime="worked"), SyntheticTask(regime="worked")
    assert a.prompts("train", 50, seed=7) == b.prompts("train", 50, seed=7)
    assert a.prompts("train", 50, seed=7) != a.prompts("train", 50, seed=8)
    assert a.prompts("heldout") == b.prompts("heldout")
    ra, rb = random.Random(5), random.Random(5)
    ps = a.prompts("train", 20, seed=1)
    assert [a.sft_target(p, ra) for p in ps] == [b.sft_target(p, rb) for p in ps]


def test_heldout_size_mix_and_disjoint_from_train_and_rounds() -> None:
    t = SyntheticTask()
    held = t.prompts("heldout")
    assert len(held) == 250 * len(DEFAULT_SKILLS)
    assert skill_mix(held) == {s: 250 for s in DEFAULT_SKILLS}
    assert len({p.id for p in held}) == len(held)
    held_ids = {p.id for p in held}
    train = t.prompts("train", 4000, seed=0)
    assert not held_ids & {p.id for p in train}
    for k in range(50):
        assert not held_ids & {p.id for p in t.round_prompts(k, 16, seed=0)}
    # The held-out set does not depend on the run seed, only on heldout_seed.
    assert SyntheticTask(heldout_seed=1).prompts("heldout") != held


def test_round_prompts_paired_and_uniform() -> None:
    # Two policies build their own SyntheticTask objects: they must see the same prompts in a round.
    a, b = SyntheticTask(regime="short"), SyntheticTask(regime="worked")
    for k in range(5):
        ra, rb = a.round_prompts(k, 16, seed=11), b.round_prompts(k, 16, seed=11)
        assert [p.id for p in ra] == [p.id for p in rb]
        assert ra == a.round_prompts(k, 16, seed=11)
        assert sorted(skill_mix(ra).values()) == [4, 4, 4, 4]
    assert a.round_prompts(0, 16, seed=11) != a.round_prompts(1, 16, seed=11)
    assert a.round_prompts(0, 16, seed=11) != a.round_prompts(0, 16, seed=12)
    mix = skill_mix(a.round_prompts(3, 10, seed=0))
    assert max(mix.values()) - min(mix.values()) <= 1


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="unknown skill"):
        SyntheticTask(skills=["div"])
    with pytest.raises(ValueError):
        SyntheticTask(regime="long")
    with pytest.raises(ValueError, match="unknown split"):
        SyntheticTask().prompts("test", 3)
    t = SyntheticTask(TaskConfig(skills=["rev"], digits={"rev": 6}))
    assert t.stop == [";"] and t.max_new_tokens == 6
    assert len(t.prompts("train", 1)[0].answer) == 6
    assert SyntheticTask(regime="worked").max_new_tokens == 26


def test_corpus_covers_prompts_and_targets() -> None:
    texts = corpus(SyntheticTask(regime="worked"), n_per_skill=20)
    assert len(texts) == 80 and all(t.endswith(";") and ">" in t for t in texts)
