"""A benchmark reads like the data it names: its own table by its own columns and answer form
(or its preset's, or the defaults), taking the training table's only where `from_task` says
so; and its problems that some policy renders longer than its limit (the benchmark's
`max_prompt_tokens`, else the policy's) are dropped for every policy, counted, so each policy
is scored on the same problems."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from chat_policies import write_problems

from mutualrl.trainer.config.run import BenchmarkSettings, TrainerConfig
from mutualrl.trainer.config.task import DatasetSettings
from mutualrl.trainer.data.chat import ContextLengthError
from mutualrl.trainer.data.dataset_task import DatasetError
from mutualrl.trainer.runtime.preflight import (
    Renderers,
    benchmark_settings,
    benchmark_tasks,
    check_benchmarks,
    policy_dir,
    prepare_dataset_task,
)

TRAIN = DatasetSettings(path=Path("train.parquet"), preset="gsm8k", prompt_key="query",
                        skill_key="kind", id_key="qid")
SHORT = [f"{a}+{a}=" for a in range(1, 7)]
LONG = ["Add these numbers and say the sum only: " + "+".join(["1"] * (20 + i)) + "="
        for i in range(3)]


def test_a_benchmark_of_its_own_path_takes_nothing_from_the_task() -> None:
    """Catches the training table's columns, answer form or skill column leaking into a
    benchmark of its own table (planted: `dataset()` merging `task.dataset`'s fields under
    the benchmark's, as it did: answer_form gsm8k and skill_key kind)."""
    own = BenchmarkSettings(name="b", path=Path("b.jsonl"), prompt_key="problem",
                            answer_key="final")
    got = own.dataset(TRAIN)
    assert (got.prompt_key, got.answer_key, got.answer_form, got.skill_key, got.id_key) == \
        ("problem", "final", "as_is", None, None)
    assert (got.path, got.split) == (Path("b.jsonl"), "test")
    plain = BenchmarkSettings(name="b", path=Path("b.jsonl")).dataset(TRAIN)
    assert (plain.prompt_key, plain.answer_key, plain.answer_form) == ("prompt", "answer",
                                                                       "as_is")
    math = BenchmarkSettings(name="m", path=Path("m.parquet"), preset="math").dataset(TRAIN)
    assert (math.prompt_key, math.answer_form, math.skill_key) == ("problem", "boxed", "type")


def test_from_task_takes_the_named_fields_only_where_the_benchmark_gives_none() -> None:
    bench = BenchmarkSettings(name="b", path=Path("test.parquet"), answer_key="gold",
                              from_task=["prompt_key", "answer_key", "answer_form", "skill_key"])
    got = bench.dataset(TRAIN)
    # the task's (its preset resolved), except the benchmark's own answer column
    assert (got.prompt_key, got.answer_key, got.answer_form, got.skill_key, got.id_key) == \
        ("query", "gold", "gsm8k", "kind", None)
    # a preset of its own wins over what from_task would take
    preset = BenchmarkSettings(name="m", path=Path("m.parquet"), preset="math",
                               from_task=["prompt_key", "skill_key", "id_key"]).dataset(TRAIN)
    assert (preset.prompt_key, preset.skill_key, preset.id_key) == ("problem", "type", "qid")
    with pytest.raises(ValueError, match=r"eval.benchmarks\[b\].from_task: the task reads no "
                                         "table"):
        bench.dataset(None)
    with pytest.raises(ValueError, match="from_task"):
        BenchmarkSettings.model_validate({"name": "b", "path": "x", "from_task": ["split"]})


def _config(tmp_path: Path, limits: dict[str, int | None], bench: dict[str, Any]
            ) -> TrainerConfig:
    table = tmp_path / "bench.jsonl"
    rows = [{"problem": p, "final": f"it is\n#### {i}"} for i, p in enumerate(SHORT + LONG)]
    table.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return TrainerConfig.model_validate({
        "run_id": "bench-data", "output_dir": str(tmp_path / "runs"),
        "task": {"dataset": {"path": str(write_problems(tmp_path / "train.parquet", 12)),
                             "prompt_key": "query", "answer_key": "gold", "skill_key": "kind"},
                 "rewards": [{"fn": "math_verify"}], "max_new_tokens": 4},
        "grpo": {"group_size": 2, "prompts_per_round": 2, "rounds": 1},
        "eval": {"benchmarks": [{"name": "own", "path": str(table), "split": "train",
                                 "prompt_key": "problem", "answer_key": "final",
                                 "answer_form": "gsm8k", "n": 2, **bench}]},
        "services": {"local": True},
        "policies": [{"name": n, "preset": preset, "max_prompt_tokens": limits.get(n)}
                     for n, preset in (("chars", "llama-char"), ("bpe", "gpt2-bpe"))],
    })


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("presets")


def test_overlong_benchmark_problems_are_dropped_for_every_policy(tmp_path: Path,
                                                                   cache: Path) -> None:
    """Catches a long benchmark problem kept for a policy that cannot take it, or dropped for
    that policy only (planted: `benchmark_tasks` without its drop: the three long problems
    stay, "Left contains 3 more items"), and a count that is not reported."""
    cfg = _config(tmp_path, {"chars": 24}, {})
    renderers = Renderers(cfg, cache)
    chars = renderers.of(cfg.policy("chars"))
    task = prepare_dataset_task(cfg, cache, renderers)
    (settings, bench), = benchmark_tasks(cfg, task, cache, renderers)
    lengths = {p.text: len(chars.ids(p)) for p in bench.problems}
    assert sorted(lengths) == sorted(SHORT) and max(lengths.values()) <= 24
    assert bench.dropped_overlong == len(LONG)
    assert [p.answer for p in bench.problems] == [str(i) for i in range(len(SHORT))]
    line, = benchmark_settings([(settings, bench)], 4)
    assert line.startswith(f"benchmark own: {tmp_path / 'bench.jsonl'} (split train): "
                           "prompt_key=problem, answer_key=final, answer_form=gsm8k; "
                           "from task.dataset: nothing; 6 problems scored, 3 dropped"), line


def test_a_benchmark_limit_of_its_own_applies_to_every_policy(tmp_path: Path,
                                                               cache: Path) -> None:
    cfg = _config(tmp_path, {}, {"max_prompt_tokens": 24})
    task = prepare_dataset_task(cfg, cache)
    (_, bench), = benchmark_tasks(cfg, task, cache)
    assert bench.dropped_overlong == len(LONG) and len(task.problems) == 12
    none = _config(tmp_path, {}, {})
    (_, kept), = benchmark_tasks(none, prepare_dataset_task(none, cache), cache)
    assert kept.dropped_overlong == 0 and len(kept.problems) == len(SHORT + LONG)
    tiny = _config(tmp_path, {}, {"max_prompt_tokens": 1})
    with pytest.raises(DatasetError, match=r"eval.benchmarks\[own\].max_prompt_tokens: every "
                                           "problem of .*bench.jsonl is longer"):
        benchmark_tasks(tiny, prepare_dataset_task(tiny, cache), cache)


def test_a_benchmark_budget_of_its_own_must_fit_each_context(tmp_path: Path,
                                                            cache: Path) -> None:
    """A benchmark that samples longer than the run is checked with its own budget: its
    longest kept problem plus its `max_new_tokens` past a model's context names the field."""
    cfg = _config(tmp_path, {"chars": 24}, {"max_new_tokens": 240})
    renderers = Renderers(cfg, cache)
    benchmarks = benchmark_tasks(cfg, prepare_dataset_task(cfg, cache, renderers), cache,
                                 renderers)
    chars, bpe = cfg.policy("chars"), cfg.policy("bpe")
    check_benchmarks(chars, renderers.of(chars), benchmarks, 4,
                     policy_dir(chars, cache, cfg.seed))  # 24 + 240 < 256 positions
    with pytest.raises(ContextLengthError, match=r"eval.benchmarks\[own\].max_new_tokens "
                                                 "240 makes .* past the model's context"):
        check_benchmarks(bpe, renderers.of(bpe), benchmarks, 4,
                         policy_dir(bpe, cache, cfg.seed))  # GPT-2's 128 positions
