"""Benchmarks: n samples per problem, avg@n and the unbiased pass@k, per policy and per skill.

With c verified successes among n samples of a problem, avg@n = c / n and
pass@k = 1 - C(n - c, k) / C(n, k) (the unbiased estimator of Chen et al., 2021: the chance
that k of the n samples drawn without replacement hold a success), averaged over problems.
pass@k >= avg@n for every k >= 1, with equality at k = 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import comb
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from mutualrl.common.config import Config
from mutualrl.trainer.data.dataset_task import (
    AnswerForm,
    DatasetSettings,
    DatasetTask,
    DatasetTaskConfig,
)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one problem with `c` successes among `n` samples."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def default_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks = [1 << i for i in range(n.bit_length()) if 1 << i <= n]
    return sorted({*ks, n})


class BenchmarkSettings(Config):
    """One benchmark of `eval.benchmarks` (scored with the task's `success_reward`)."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    """Its name in metrics (`bench/<name>/avg@n`)."""
    path: Path
    """A local table, as `task.dataset.path`."""
    split: str = "test"
    """The split to read."""
    preset: Literal["gsm8k", "math"] | None = None
    """GSM8K or MATH column names, as `task.dataset.preset`."""
    prompt_key: str | None = None
    """Column of the problem (default: the task dataset's)."""
    answer_key: str | None = None
    """Column of the reference answer (default: the task dataset's)."""
    answer_form: AnswerForm | None = None
    """How the reference is read (default: the task dataset's)."""
    skill_key: str | None = None
    """Column naming each problem's skill (per-skill figures; default: the task dataset's)."""
    n: int = Field(8, ge=1)
    """Samples per problem."""
    k: list[int] | None = None
    """The k of pass@k (each <= n); default 1, 2, 4, ... and n."""
    temperature: float = Field(1.0, ge=0)
    """Sampling temperature (0: greedy, meaningful with n = 1 only)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling: the smallest set of tokens with this much probability (1: off)."""
    top_k: int = Field(0, ge=0)
    """Sample among the k most likely tokens only (0: off)."""
    min_p: float = Field(0.0, ge=0, le=1)
    """Drop tokens below this share of the most likely one's probability (0: off)."""
    max_new_tokens: int | None = Field(None, ge=1)
    """Token budget per completion (default: the run's)."""
    limit: int | None = Field(None, ge=1)
    """Evaluate the first N problems only."""

    @model_validator(mode="after")
    def _ks_fit(self) -> BenchmarkSettings:
        bad = [k for k in self.k or [] if not 1 <= k <= self.n]
        if bad:
            raise ValueError(f"eval.benchmarks[{self.name}].k: {bad} not in [1, n={self.n}]")
        return self

    def dataset(self, train: DatasetSettings | None) -> DatasetSettings:
        """The benchmark's table settings: its own fields over the task dataset's columns."""
        base = {} if train is None else train.resolved().model_dump(
            include={"prompt_key", "answer_key", "answer_form", "skill_key"}, exclude_none=True)
        if self.preset is not None:
            base = {}
        own = self.model_dump(include={"path", "split", "preset", "prompt_key", "answer_key",
                                       "answer_form", "skill_key", "limit"}, exclude_none=True)
        return DatasetSettings.model_validate({**base, **own}).resolved()


def benchmark_task(bench: BenchmarkSettings, task: Any) -> DatasetTask:
    """The benchmark's problems, rendered and scored as the run's task does (its system
    prompt, template and reward functions); a synthetic task's run scores with math_verify."""
    where = f"eval.benchmarks[{bench.name}]"
    if isinstance(task, DatasetTask):
        cfg = task.cfg.model_copy(update={"dataset": bench.dataset(task.cfg.dataset)})
        return DatasetTask(cfg, where, rewards=task.rewards)
    return DatasetTask(DatasetTaskConfig(dataset=bench.dataset(None)), where)


def summarize(name: str, skills: Sequence[str], successes: Sequence[int], n: int,
              ks: Sequence[int]) -> dict[str, float]:
    """bench/<name>/avg@n and pass@k over all problems and per skill (`successes[i]`: problem
    i's successes out of n)."""
    out: dict[str, float] = {}
    groups: dict[str, list[int]] = {"": list(successes)}
    if len(set(skills)) > 1:
        for s, c in zip(skills, successes, strict=True):
            groups.setdefault(f"{s}/", []).append(c)
    for prefix, cs in groups.items():
        key = f"bench/{name}/{prefix}"
        out[f"{key}avg@{n}"] = sum(cs) / (n * len(cs))
        for k in ks:
            out[f"{key}pass@{k}"] = sum(pass_at_k(n, c, k) for c in cs) / len(cs)
    out[f"bench/{name}/problems"] = float(len(successes))
    return out


def run_benchmark(bench: BenchmarkSettings, task: Any, renderer: Any, engine: Any, dist: Any,
                  max_new_tokens: int, tau: float, seed: int) -> dict[str, float]:
    """One benchmark over `engine` (data parallel: each rank samples its block of problems)."""
    from mutualrl.trainer.data.dataset_task import score_round
    from mutualrl.trainer.runtime.loop import prompt_seed

    problems = task.problems
    mine = dist.block(len(problems))
    part = engine.generate(
        renderer.many([problems[i] for i in mine]), n=bench.n,
        max_new_tokens=bench.max_new_tokens or max_new_tokens, temperature=bench.temperature,
        top_p=bench.top_p, top_k=bench.top_k, min_p=bench.min_p,
        stop=task.stop, seeds=[prompt_seed(seed, -1, i) for i in mine])
    samples = [row for rows in dist.all_gather(part) for row in rows]
    correct = score_round(task, problems, samples, tau).correct
    return summarize(bench.name, [p.skill for p in problems], [sum(r) for r in correct],
                     bench.n, bench.k or default_ks(bench.n))
