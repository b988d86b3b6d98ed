"""A run's inputs, checked before round 0: what the trainer checks when it starts, and what
`mutualrl up` and `mutualrl train --dry-run` check before anything starts; and where they come
from (`policy_dir`: a policy's weights and tokenizer; `prepare_dataset_task`: the table).

- the task: its table and columns, and that it fills a round (`DatasetError`), its reward
  functions called once (`RewardError`);
- each policy: its chat template renders every problem (`ChatTemplateError`, naming the
  template's file), and its longest rendered prompt plus `max_new_tokens` fits the model's
  context (`ContextLengthError`, naming the prompt, both lengths and the config field the
  context comes from), also with a benchmark's own `max_new_tokens`;
- each benchmark: its problems some policy renders longer than its limit dropped for every
  policy (`benchmark_tasks`), so every policy is scored on the same problems.

Each error's message names the field to fix (`dataset_task.ExperimentInputError`). Nothing loads
a model's weights: tokenizers and config.json only. The prompts measured are every problem of
a table or JSONL task and of every benchmark, and of a generated task its held-out set and 512
train draws (a skill's problems have one length in characters).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from mutualrl.thl.tokenizers import load_tokenizer
from mutualrl.trainer.config.run import BenchmarkSettings, PolicySettings, TrainerConfig
from mutualrl.trainer.config.task import DatasetTaskConfig
from mutualrl.trainer.data.chat import ContextLengthError, PromptRenderer, renderer_for
from mutualrl.trainer.data.dataset_task import DatasetTask
from mutualrl.trainer.data.evaluation import benchmark_task
from mutualrl.trainer.data.task_factory import make_task
from mutualrl.trainer.data.tasks import Prompt, SyntheticTask, Task
from mutualrl.trainer.runtime.presets import ensure_preset

log = logging.getLogger(__name__)

CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length",
                  "seq_length", "n_ctx", "max_seq_len")
"""config.json keys that give a model's context length, first found wins (GPT-2 writes
`n_positions`, most others `max_position_embeddings`)."""
TRAIN_DRAWS = 512
"""Train prompts of a generated task rendered for the check."""


@dataclass(frozen=True)
class PromptBudget:
    """A policy's longest rollout: its longest rendered prompt plus its completion budget."""

    policy: str
    prompt_tokens: int
    """Tokens of the longest rendered prompt."""
    prompt_id: str
    max_new_tokens: int
    context: int | None
    """The model's context in tokens (None: its config gives none)."""
    context_source: str
    """Where `context` comes from, e.g. `n_positions in models/gpt2/config.json`."""
    problems: int
    """Problems rendered to find the longest."""
    benchmarks: tuple[str, ...] = ()
    """What each benchmark reads and how it samples for this policy (`benchmark_settings`)."""

    @property
    def seq_tokens(self) -> int:
        """Tokens of the longest rollout (prompt + completion budget)."""
        return self.prompt_tokens + self.max_new_tokens

    def describe(self) -> str:
        room = f" of {self.context} ({self.context_source})" if self.context else ""
        return (f"{self.policy}: longest prompt {self.prompt_tokens} tokens "
                f"({self.prompt_id!r}) + {self.max_new_tokens} new = {self.seq_tokens}{room}")


def policy_dir(policy: PolicySettings, cache_dir: Path, seed: int) -> Path:
    """Where the policy's weights and tokenizer load from: its warm start (`sft_checkpoint`),
    else its `model_path`, else its preset (built once, offline, into `cache_dir`)."""
    if policy.sft_checkpoint is not None:
        return policy.sft_checkpoint
    if policy.model_path is not None:
        return policy.model_path
    assert policy.preset is not None
    return ensure_preset(policy.preset, cache_dir, seed)


class Renderers:
    """Every policy's renderer (its tokenizer and chat template), loaded on first use: what
    measures a problem as each policy will render it."""

    def __init__(self, cfg: TrainerConfig, cache: Path) -> None:
        self.cfg, self.cache = cfg, cache
        self._loaded: dict[str, PromptRenderer] = {}

    def of(self, policy: PolicySettings) -> PromptRenderer:
        if policy.name not in self._loaded:
            tok = load_tokenizer(policy_dir(policy, self.cache, self.cfg.seed))
            self._loaded[policy.name] = renderer_for(tok, policy)
        return self._loaded[policy.name]

    def too_long(self, limits: dict[str, int | None]) -> list[Callable[[Prompt], bool]]:
        """Per policy with a limit in `limits` (name -> tokens): whether it renders a problem
        longer than that."""
        out = []
        for p in self.cfg.policies:
            limit = limits.get(p.name)
            if limit is not None:
                out.append(_longer_than(self.of(p), limit))
        return out


def _longer_than(renderer: PromptRenderer, limit: int) -> Callable[[Prompt], bool]:
    return lambda prompt: len(renderer.ids(prompt)) > limit


def prepare_dataset_task(cfg: TrainerConfig, cache: Path,
                         renderers: Renderers | None = None) -> DatasetTask:
    """The run's table with the problems some policy renders longer than its
    `max_prompt_tokens` dropped (every trainer drops the same ones: each renders with every
    policy's tokenizer), and its reward functions called once, so that a problem shows before
    round 0."""
    assert isinstance(cfg.task, DatasetTaskConfig)
    task = DatasetTask(cfg.task)
    task.check_rewards()
    checks = (renderers or Renderers(cfg, cache)).too_long(
        {p.name: p.max_prompt_tokens for p in cfg.policies})
    if checks:
        n = task.drop_overlong(checks)
        log.info("task.dataset: %d of %d problems dropped as longer than a policy's "
                 "max_prompt_tokens", n, n + len(task.problems))
    return task


def benchmark_tasks(cfg: TrainerConfig, task: Task, cache: Path,
                    renderers: Renderers | None = None
                    ) -> list[tuple[BenchmarkSettings, DatasetTask]]:
    """Each of `eval.benchmarks` with its problems, less those some policy renders longer
    than the benchmark's `max_prompt_tokens` (default: the policy's own): dropped for every
    policy, so each is scored on the same problems (`DatasetTask.dropped_overlong` counts
    them)."""
    renderers = renderers or Renderers(cfg, cache)
    out = []
    for b in cfg.eval.benchmarks:
        bench = benchmark_task(b, task)
        checks = renderers.too_long({p.name: b.max_prompt_tokens or p.max_prompt_tokens
                                     for p in cfg.policies})
        if checks:
            bench.drop_overlong(checks, f"eval.benchmarks[{b.name}].max_prompt_tokens")
            log.info("eval.benchmarks[%s]: %d of %d problems dropped as longer than a "
                     "policy's limit", b.name, bench.dropped_overlong,
                     bench.dropped_overlong + len(bench.problems))
        out.append((b, bench))
    return out


def check_benchmarks(policy: PolicySettings, renderer: PromptRenderer,
                     benchmarks: Sequence[tuple[BenchmarkSettings, DatasetTask]],
                     max_new_tokens: int, model_dir: Path) -> None:
    """A benchmark with a larger completion budget than the run's: its longest problem plus
    that budget fits the model's context (ContextLengthError naming the benchmark's field)."""
    for b, bench in benchmarks:
        if b.max_new_tokens is not None and b.max_new_tokens > max_new_tokens:
            prompt_budget(policy, renderer, bench.problems, b.max_new_tokens, model_dir,
                          f"eval.benchmarks[{b.name}].max_new_tokens")


def benchmark_settings(benchmarks: Sequence[tuple[BenchmarkSettings, DatasetTask]],
                       max_new_tokens: int) -> list[str]:
    """What each benchmark reads and how it samples, for a policy whose run budget is
    `max_new_tokens`: one line a benchmark (`--dry-run` prints them per policy)."""
    lines = []
    for b, bench in benchmarks:
        ds = bench.ds
        columns = ", ".join(f"{k}={getattr(ds, k)}" for k in
                            ("prompt_key", "answer_key", "answer_form", "skill_key", "id_key")
                            if getattr(ds, k) is not None)
        taken = ", ".join(b.from_task) or "nothing"
        lines.append(
            f"benchmark {b.name}: {ds.path} (split {ds.split}): {columns}; from task.dataset: "
            f"{taken}; {len(bench.problems)} problems scored, {bench.dropped_overlong} dropped "
            f"as longer than a policy's limit; n={b.n}, max_new_tokens="
            f"{b.max_new_tokens or max_new_tokens}, temperature={b.temperature:g}")
    return lines


def model_context(model_dir: Path, policy: PolicySettings) -> tuple[int | None, str]:
    """The context length of the model in `model_dir` (its config.json), lowered to
    `vllm.max_model_len` when the policy's vLLM engine is given one."""
    context, source = None, ""
    path = Path(model_dir) / "config.json"
    if path.is_file():
        raw = json.loads(path.read_text(encoding="utf-8"))
        for scope, prefix in ((raw, ""), (raw.get("text_config") or {}, "text_config.")):
            found = next((k for k in CONTEXT_FIELDS
                          if isinstance(scope.get(k), int) and scope[k] > 0), None)
            if found is not None:
                context, source = int(scope[found]), f"{prefix}{found} in {path}"
                break
    cap = policy.vllm.max_model_len if policy.rollout_engine == "vllm" else None
    if cap is not None and (context is None or cap < context):
        context, source = int(cap), f"policies[{policy.name}].vllm.max_model_len"
    return context, source


def problems_to_render(task: Task, benchmarks: Sequence[DatasetTask] = ()) -> list[Prompt]:
    """The problems whose rendering a policy's rollouts can meet (see the module docstring)."""
    if isinstance(task, SyntheticTask):
        out = task.prompts("heldout") + task.prompts("train", TRAIN_DRAWS)
    else:
        out = task.prompts("train") + task.prompts("heldout")
    for bench in benchmarks:
        out += list(bench.problems)
    return out


def prompt_budget(policy: PolicySettings, renderer: PromptRenderer,
                  problems: Sequence[Prompt], max_new_tokens: int,
                  model_dir: Path, budget_field: str = "grpo.max_new_tokens") -> PromptBudget:
    """The policy's longest rollout; ContextLengthError when it exceeds the model's context.
    `budget_field`: the config field `max_new_tokens` comes from, for the message."""
    lengths = renderer.lengths(problems)
    at = max(range(len(lengths)), key=lengths.__getitem__) if lengths else -1
    longest = lengths[at] if lengths else 0
    context, source = model_context(model_dir, policy)
    budget = PromptBudget(policy=policy.name, prompt_tokens=longest,
                          prompt_id=problems[at].id if lengths else "",
                          max_new_tokens=max_new_tokens, context=context,
                          context_source=source, problems=len(problems))
    if context is not None and budget.seq_tokens > context:
        fixes = [f"lower {budget_field}"]
        if policy.max_prompt_tokens is None or policy.max_prompt_tokens + max_new_tokens > \
                context:
            fixes.append(f"set policies[{policy.name}].max_prompt_tokens <= "
                         f"{max(context - max_new_tokens, 1)} (drops longer problems)")
        fixes.append("or train a model with a longer context")
        raise ContextLengthError(
            f"policies[{policy.name}]: problem {budget.prompt_id!r} renders to "
            f"{longest} tokens, which with {budget_field} {max_new_tokens} makes "
            f"{budget.seq_tokens}, past the model's context of {context} tokens ({source}): "
            + ", ".join(fixes))
    return budget


def max_new_tokens_field(cfg: TrainerConfig) -> str:
    """The field a policy's completion budget comes from: `grpo.max_new_tokens` when set, else
    the task's."""
    return "grpo.max_new_tokens" if cfg.grpo.max_new_tokens else "task.max_new_tokens"


def check_inputs(cfg: TrainerConfig, names: Sequence[str] | None = None,
                 cache_dir: Path | None = None) -> list[PromptBudget]:
    """Check the run's task and each policy in `names` (default: all) as their trainers will
    (see the module docstring); returns each policy's longest rollout. A policy whose warm start
    is not made yet is checked with the model it starts from (the same tokenizer)."""
    cache = cache_dir or cfg.output_dir / "presets"
    renderers = Renderers(cfg, cache)
    task = prepare_dataset_task(cfg, cache, renderers) if isinstance(cfg.task,
                                                                     DatasetTaskConfig) \
        else make_task(cfg.task)
    if isinstance(task, DatasetTask):  # a table too small for one round says so now
        task.round_prompts(0, cfg.grpo.prompts_per_round, cfg.seed)
    benchmarks = benchmark_tasks(cfg, task, cache, renderers)
    problems = problems_to_render(task, [t for _, t in benchmarks])
    out = []
    for name in names or [p.name for p in cfg.policies]:
        pcfg = cfg.for_policy(name)
        policy = pcfg.policy(name)
        if policy.sft_checkpoint is not None and not policy.sft_checkpoint.exists():
            policy = policy.model_copy(update={"sft_checkpoint": None})
        start = policy_dir(policy, cache, cfg.seed)
        if not (Path(start) / "config.json").is_file():
            raise ValueError(f"policies[{name}]: {start} has no config.json (model_path must "
                             "be a save_pretrained directory)")
        renderer = renderer_for(load_tokenizer(start), policy)
        max_new = pcfg.grpo.max_new_tokens or task.max_new_tokens
        budget = prompt_budget(policy, renderer, problems, max_new, Path(start),
                               max_new_tokens_field(pcfg))
        check_benchmarks(policy, renderer, benchmarks, max_new, Path(start))
        budget = replace(budget, benchmarks=tuple(benchmark_settings(benchmarks, max_new)))
        log.info("%s", budget.describe())
        out.append(budget)
    return out
