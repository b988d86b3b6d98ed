"""Tables through `datasets` from local files: column mapping, seeded epochs without
replacement whose position resumes, the over-long filter, presets, and errors naming the
field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chat_policies import write_problems

from mutualrl.trainer.config.task import DatasetSettings, DatasetTaskConfig
from mutualrl.trainer.data.dataset_task import DatasetError, DatasetTask


def _task(path: Path, **kw: object) -> DatasetTask:
    ds = {"path": str(path), "prompt_key": "query", "answer_key": "gold", "skill_key": "kind",
          **kw}
    return DatasetTask(DatasetTaskConfig.model_validate({"dataset": ds, "system": "be brief"}))


def test_parquet_with_own_column_names(tmp_path: Path) -> None:
    task = _task(write_problems(tmp_path / "t.parquet", 20))
    assert len(task.problems) == 20 and set(task.skills) == {"small", "large"}
    p = task.problems[0]
    assert p.text == "be brief\n\nadd:1+0=" and p.answer == "1"
    assert p.messages == (("system", "be brief"), ("user", "add:1+0="))
    assert task.columns(p)["gold"] == "1"


def test_epochs_without_replacement_resume_at_the_saved_position(tmp_path: Path) -> None:
    path = write_problems(tmp_path / "t.parquet", 12)
    task = _task(path)
    epoch0 = [p.id for k in range(3) for p in task.round_prompts(k, 4, seed=5)]
    assert sorted(epoch0) == sorted(p.id for p in task.problems)  # each problem once
    epoch1 = [p.id for k in range(3, 6) for p in task.round_prompts(k, 4, seed=5)]
    assert sorted(epoch1) == sorted(epoch0) and epoch1 != epoch0  # reshuffled
    assert [p.id for p in _task(path).round_prompts(4, 4, seed=5)] == epoch1[4:8]
    assert [p.id for p in task.round_prompts(0, 4, seed=6)] != epoch0[:4]
    state = task.state_dict(4, 4, seed=5)
    assert state["epoch"] == 1 and state["index"] == 4
    resumed = _task(path)
    resumed.load_state_dict(json.loads(json.dumps(state)), 4, 4)
    assert [p.id for p in resumed.round_prompts(4, 4, seed=5)] == epoch1[4:8]
    # Rounds of another size continue from the same position of the same order.
    halves = _task(path)
    halves.load_state_dict(state, 8, 2)
    assert [p.id for p in halves.round_prompts(8, 2, 5)] == epoch1[4:6]
    with pytest.raises(DatasetError, match=r"task\.dataset"):
        _task(path, limit=10).load_state_dict(state, 4, 4)


def test_overlong_problems_are_dropped_and_counted(tmp_path: Path) -> None:
    task = _task(write_problems(tmp_path / "t.parquet", 20))
    n = task.drop_overlong([lambda p: p.answer == "5", lambda p: False])
    assert n == 2 and all(p.answer != "5" for p in task.problems)


def test_gsm8k_and_math_jsonl_as_presets(tmp_path: Path) -> None:
    g = tmp_path / "g.jsonl"
    g.write_text(json.dumps({"question": "2+2?", "answer": "two and two\n#### 4"}) + "\n")
    task = DatasetTask(DatasetTaskConfig(dataset=DatasetSettings(path=g, preset="gsm8k")))
    assert task.problems[0].answer == "4" and task.problems[0].text == "2+2?"
    m = tmp_path / "m.jsonl"
    m.write_text(json.dumps({"problem": "x?", "solution": "so $\\boxed{\\frac12}$",
                             "type": "Number Theory"}) + "\n")
    task = DatasetTask(DatasetTaskConfig(dataset=DatasetSettings(path=m, preset="math")))
    assert task.problems[0].answer == "\\frac12" and task.skills == ("number_theory",)


def test_chat_message_prompts(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"prompt": [{"role": "user", "content": "1+1?"}],
                                "answer": "2"}) + "\n")
    task = DatasetTask(DatasetTaskConfig(dataset=DatasetSettings(path=path), system="s"))
    assert task.problems[0].messages == (("system", "s"), ("user", "1+1?"))
    assert task.conversational


def test_bad_tables_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"task.dataset.path: .*missing.parquet does not exist"):
        _task(tmp_path / "missing.parquet")
    path = write_problems(tmp_path / "t.parquet", 4)
    with pytest.raises(DatasetError, match=r"task.dataset.answer_key: no column 'answer'.*"
                       r"\['query', 'gold', 'kind'\]"):
        _task(path, answer_key="answer")
    with pytest.raises(DatasetError, match=r"task.dataset.prompt_key: no column 'question'"):
        _task(path, prompt_key="question")
    with pytest.raises(DatasetError, match=r"task\.dataset"):
        _task(path).round_prompts(0, 8, 0)  # 4 problems cannot fill a round of 8
    with pytest.raises(ValueError, match=r"task\.success_reward"):
        DatasetTaskConfig.model_validate({"dataset": {"path": str(path)},
                                          "success_reward": "nope"})


def test_every_local_format_reads_the_same_problems(tmp_path: Path) -> None:
    import datasets

    table = datasets.Dataset.from_parquet(str(write_problems(tmp_path / "t.parquet", 6)))
    table.to_csv(str(tmp_path / "t.csv"))
    table.to_json(str(tmp_path / "t.jsonl"))
    table.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"test": table}).save_to_disk(str(tmp_path / "dict"))
    want = [p.id for p in _task(tmp_path / "t.parquet").problems]
    for path, split in ((tmp_path / "t.csv", "train"), (tmp_path / "t.jsonl", "train"),
                        (tmp_path / "saved", "train"), (tmp_path / "dict", "test")):
        assert [p.id for p in _task(path, split=split).problems] == want, path
    with pytest.raises(DatasetError, match=r"task.dataset.split: .* has no split 'train'.*"
                       r"\['test'\]"):
        _task(tmp_path / "dict")
