"""Answer extraction, normalisation and rewards on tricky answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mutualrl.trainer.config.task import JsonlTaskConfig, TaskConfig
from mutualrl.trainer.data.answers import (
    after_hashes,
    answers_match,
    last_boxed,
    last_number,
    normalize,
    to_number,
)
from mutualrl.trainer.data.jsonl import JsonlTask
from mutualrl.trainer.data.task_factory import make_task
from mutualrl.trainer.data.tasks import SyntheticTask


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("\\frac{1}{2}", "1/2"),
        ("0.5", "\\frac{1}{2}"),
        (".50", "\\dfrac12"),
        ("\\tfrac{1}{2}", "0.5"),
        ("1,000", "1000"),
        ("1,234,567", "1234567"),
        ("-\\frac{3}{4}", "-0.75"),
        ("\\frac{-3}{4}", "-3/4"),
        ("\u22127", "-7"),
        ("72 dollars", "72"),
        ("\\$72.00", "72"),
        ("x = 5", "5"),
        ("50\\%", "50"),
        ("10^{\\circ}", "10"),
        ("\\text{(A)}", "(A)"),
        ("\\sqrt2", "\\sqrt{2}"),
        ("\\frac{\\sqrt{3}}{2}", "\\dfrac{\\sqrt3}{2}"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("5.", "5"),
    ],
)
def test_equivalent_answers_match(pred: str, gold: str) -> None:
    assert answers_match(pred, gold), (normalize(pred), normalize(gold))


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("(1,2)", "(1,3)"),
        ("12/5+1", "12/5"),
        ("3", "3.0001"),
        ("1/0", "0"),
        ("-5", "5"),
        ("0.33", "1/3"),
        ("72 + 1", "72"),
        ("", "0"),
        (None, "0"),
    ],
)
def test_different_answers_do_not_match(pred: str | None, gold: str) -> None:
    assert not answers_match(pred, gold)


def test_to_number_forms() -> None:
    assert to_number("1/2") == to_number("0.5") == to_number(".5")
    assert to_number("-3") == -3
    assert to_number("abc") is None and to_number("1/0") is None


def test_boxed_nested_and_last() -> None:
    text = "first \\boxed{1} then \\boxed{\\frac{1}{\\sqrt{2}}} and more words."
    assert last_boxed(text) == "\\frac{1}{\\sqrt{2}}"
    assert last_boxed("so $\\boxed 5$.") == "5"
    assert last_boxed("\\fbox{7}") == "7"
    assert last_boxed("\\boxed{unbalanced") is None
    assert last_boxed("no box") is None


def test_hashes_and_last_number() -> None:
    assert after_hashes("steps\n#### 1,234 dollars\nmore") == "1,234 dollars"
    assert after_hashes("#### 1\n#### 2") == "2"
    assert after_hashes("no marker") is None
    assert last_number("it is -3.5 or 12, ok") == "12"
    assert last_number("paid 1,234,567.5 total") == "1,234,567.5"
    assert last_number("none") is None


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    return path


def test_jsonl_gsm8k_reward_and_truncation(tmp_path: Path) -> None:
    rows = [{"question": f"What is {i}+{i}?", "answer": f"{i}+{i}={2*i}\n#### {2*i:,}"}
            for i in range(1000, 1040)]
    cfg = JsonlTaskConfig(path=_write(tmp_path / "g.jsonl", rows), heldout_fraction=0.25,
                          format_reward=0.1)
    task = make_task(cfg)
    assert isinstance(task, JsonlTask)
    train, held = task.prompts("train"), task.prompts("heldout")
    assert train and held and not {p.id for p in train} & {p.id for p in held}
    assert len(train) + len(held) == 40
    p = train[0]
    assert p.text.startswith("Question: What is") and p.skill == "gsm8k"
    n = int(p.answer.replace(",", ""))
    assert task.reward(p, f"so #### {n:,}", "stop") == 1.0
    assert task.reward(p, f"so #### {n}.00 apples", "stop") == 1.0
    assert task.reward(p, f"#### {n}", "length") == 0.0  # truncated: never verified
    assert task.reward(p, "#### 3", "stop") == pytest.approx(0.1)  # format only
    assert task.reward(p, f"the answer is {n}", "stop") == 0.0  # no marker, no fallback
    assert task.sft_target(p, None).strip().endswith(p.answer)  # type: ignore[arg-type]


def test_jsonl_math_boxed_with_fallback(tmp_path: Path) -> None:
    rows = [
        {"problem": "Half of one?", "solution": "It is $\\boxed{\\frac{1}{2}}$.",
         "type": "Prealgebra", "unique_id": "a"},
        {"problem": "Two thirds?", "solution": "$\\boxed{\\dfrac{2}{3}}$", "type": "Algebra",
         "unique_id": "b"},
    ]
    held = [{"problem": "Minus one?", "solution": "\\boxed{-1}", "type": "Algebra",
             "unique_id": "c"}]
    cfg = JsonlTaskConfig(path=_write(tmp_path / "m.jsonl", rows),
                          heldout_path=_write(tmp_path / "h.jsonl", held),
                          fallback_last_number=True)
    task = JsonlTask(cfg)
    assert task.skills == ("algebra", "prealgebra")
    half = next(p for p in task.prompts("train") if p.id == "a")
    assert half.answer == "\\frac{1}{2}"
    assert task.reward(half, "so \\boxed{0.5}", "stop") == 1.0
    assert task.reward(half, "so \\boxed{1/2} \\boxed{3}", "stop") == 0.0  # last box counts
    assert task.reward(half, "it is 0.5", "stop") == 1.0  # fallback to the last number
    [minus] = task.prompts("heldout")
    assert task.reward(minus, "$\\boxed{-1}$", "stop") == 1.0
    rp = task.round_prompts(0, 4, seed=1)
    assert rp == task.round_prompts(0, 4, seed=1)
    assert {p.skill for p in rp} == {"algebra", "prealgebra"}


def test_jsonl_bad_record_names_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "q", "answer": "#### 1"}\n{"oops": 1}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        JsonlTask(JsonlTaskConfig(path=path))


def test_synthetic_verifier_edge_cases() -> None:
    short = SyntheticTask(TaskConfig(regime="short"))
    p = short.prompts("heldout", 1)[0]
    a = p.answer
    assert short.reward(p, f"{a};", "stop") == 1.0
    assert short.reward(p, f"{a};", "length") == 0.0  # marker inside a truncated output
    assert short.reward(p, f"{a}", "stop") == 0.0  # no end marker
    assert short.reward(p, f"{a}0;", "stop") == 0.0
    assert short.reward(p, f" {a} ;", "stop") == 1.0  # surrounding spaces are tolerated
    worked = SyntheticTask(regime="worked", format_reward=0.25)
    q = worked.prompts("heldout", 1)[0]
    assert worked.reward(q, f"1+2=3>9>{q.answer};", "stop") == 1.0  # after the LAST `>`
    assert worked.reward(q, f"{q.answer};", "stop") == 0.0  # no `>`: not the worked format
    assert worked.reward(q, "1+2=3>0;", "stop") == pytest.approx(0.25)
    assert worked.is_correct(q, f">{q.answer};", "stop")
    assert not worked.is_correct(q, f">{q.answer};", "length")
