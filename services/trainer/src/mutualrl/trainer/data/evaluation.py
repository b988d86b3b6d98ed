"""Benchmarks: n samples per problem, avg@n and the unbiased pass@k, per policy and per skill.

With c verified successes among n samples of a problem, avg@n = c / n and
pass@k = 1 - C(n - c, k) / C(n, k) (the unbiased estimator of Chen et al., 2021: the chance
that k of the n samples drawn without replacement hold a success), averaged over problems.
pass@k >= avg@n for every k >= 1, with equality at k = 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import comb
from typing import Protocol, TypeVar

from mutualrl.trainer.config.run import BenchmarkSettings
from mutualrl.trainer.config.task import DatasetTaskConfig
from mutualrl.trainer.data.chat import PromptRenderer
from mutualrl.trainer.data.dataset_task import DatasetTask, score_round
from mutualrl.trainer.data.tasks import Task
from mutualrl.trainer.engines.base import RolloutEngine, prompt_seed

T = TypeVar("T")


class Ranks(Protocol):
    """What a benchmark needs of the data-parallel ranks (`runtime.distributed.Dist`)."""

    def block(self, n: int) -> range:
        """This rank's block of `n` items."""
        ...

    def all_gather(self, obj: T) -> list[T]:
        """Every rank's `obj`, in rank order."""
        ...


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


def benchmark_task(bench: BenchmarkSettings, task: Task) -> DatasetTask:
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


def run_benchmark(bench: BenchmarkSettings, task: DatasetTask, renderer: PromptRenderer,
                  engine: RolloutEngine, dist: Ranks, max_new_tokens: int, tau: float,
                  seed: int) -> dict[str, float]:
    """One benchmark over `engine` (data parallel: each rank samples its block of problems)."""
    problems = task.problems
    mine = dist.block(len(problems))
    part = engine.generate(
        renderer.many([problems[i] for i in mine]), n=bench.n,
        max_new_tokens=bench.max_new_tokens or max_new_tokens, temperature=bench.temperature,
        top_p=bench.top_p, top_k=bench.top_k, min_p=bench.min_p,
        stop=task.stop, seeds=[prompt_seed(seed, -1, i) for i in mine])
    samples = [row for rows in dist.all_gather(part) for row in rows]
    correct = score_round(task, problems, samples, tau).correct
    out = summarize(bench.name, [p.skill for p in problems], [sum(r) for r in correct],
                    bench.n, bench.k or default_ks(bench.n))
    out[f"bench/{bench.name}/dropped_overlong"] = float(task.dropped_overlong)
    return out
