"""A task read through Hugging Face `datasets` from local files, scored by reward functions.

    task:
      dataset: {path: data/gsm8k/train.parquet, prompt_key: question, answer_key: answer,
                answer_form: gsm8k}
      system: "Reason step by step and put the final answer in \\boxed{}."
      rewards: [{fn: math_verify}, {fn: my_rewards.py:brevity, weight: 0.1}]
      success_reward: math_verify

The prompt column holds text (formatted through `prompt_template`) or chat messages (a list of
`{role, content}`, TRL's conversational form); each policy renders the problem with its own
chat template (mutualrl.trainer.data.chat). Problems come in shuffled epochs without replacement,
seeded and identical for every policy: round k of an epoch of N problems and P prompts a round
takes the k-th block of P of that epoch's order (the N mod P left over sit that epoch out).
Nothing is downloaded: `path` is a parquet / arrow / json / jsonl / csv file, a folder of them,
or a `save_to_disk` directory.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from mutualrl.trainer.config.task import DatasetSettings, DatasetTaskConfig
from mutualrl.trainer.data.answers import after_hashes, last_boxed
from mutualrl.trainer.data.chat import ChatTemplateError, ContextLengthError
from mutualrl.trainer.data.rewards import Batch, RewardError, RewardSet
from mutualrl.trainer.data.tasks import Prompt, Task
from mutualrl.trainer.engines.base import Sample

log = logging.getLogger(__name__)
T = TypeVar("T")
_FORMATS = {".parquet": "parquet", ".arrow": "arrow", ".json": "json", ".jsonl": "json",
            ".csv": "csv"}


class DatasetError(ValueError):
    """A dataset that cannot be read as configured (the message names the field)."""


# What a user's own experiment can get wrong before round 0; each message names the field.
ExperimentInputError = (DatasetError, RewardError, ChatTemplateError, ContextLengthError)


def load_table(ds_cfg: DatasetSettings, where: str = "task.dataset") -> Any:
    """The `datasets.Dataset` the settings point at, its columns checked."""
    import datasets

    path = Path(ds_cfg.path)
    if not path.exists():
        raise DatasetError(f"{where}.path: {path} does not exist")
    if path.is_dir() and any((path / f).exists() for f in
                             ("state.json", "dataset_dict.json", "dataset_info.json")):
        table = datasets.load_from_disk(str(path))
        if isinstance(table, datasets.DatasetDict):
            if ds_cfg.split not in table:
                raise DatasetError(f"{where}.split: {path} has no split {ds_cfg.split!r}; it has "
                                   f"{sorted(table)}")
            table = table[ds_cfg.split]
    elif path.is_dir():
        table = datasets.load_dataset(str(path), split=ds_cfg.split)
    else:
        fmt = _FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise DatasetError(f"{where}.path: {path} is not one of {sorted(_FORMATS)}")
        table = datasets.load_dataset(fmt, data_files={ds_cfg.split: str(path)},
                                      split=ds_cfg.split)
    cols = list(table.column_names)
    for key in ("prompt_key", "answer_key", "skill_key", "id_key"):
        name = getattr(ds_cfg, key)
        if name is not None and name not in cols:
            raise DatasetError(f"{where}.{key}: no column {name!r} in {path}; its columns are "
                               f"{cols}")
    if ds_cfg.limit is not None:
        table = table.select(range(min(ds_cfg.limit, len(table))))
    return table


def reference_of(value: Any, form: str) -> str | None:
    """The reference answer an answer-column value holds."""
    text = str(value)
    if form == "gsm8k":
        return after_hashes(text)
    if form == "boxed":
        return last_boxed(text)
    return text.strip() or None


def _chat_messages(value: Any) -> list[tuple[str, str]] | None:
    if isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value):
        return [(str(m.get("role", "user")), str(m["content"])) for m in value]
    return None


class DatasetTask:
    """Rows of a table behind the task interface of `mutualrl.trainer.data.tasks.Task`."""

    regime = "dataset"

    def __init__(self, cfg: DatasetTaskConfig, where: str = "task.dataset",
                 rewards: RewardSet | None = None) -> None:
        self.cfg = cfg
        self.ds = cfg.dataset.resolved()
        self.prompt_key: str = self.ds.prompt_key or "prompt"
        self.answer_key: str = self.ds.answer_key or "answer"
        table = load_table(self.ds, where)
        self.stop: list[str] = list(cfg.stop)
        self.max_new_tokens: int = cfg.max_new_tokens
        self.rewards = rewards or RewardSet(cfg.rewards, cfg.max_new_tokens, cfg.reward_timeout_s)
        self._rows: dict[str, dict[str, Any]] = {}
        self.conversational = False
        problems: list[Prompt] = []
        missing = 0
        for row in table:
            p = self._prompt(row)
            if p is None:
                missing += 1
                continue
            if p.id not in self._rows:  # a repeated problem counts once
                self._rows[p.id] = row
                problems.append(p)
        if missing:
            log.warning("%s: %d rows without a reference answer skipped", where, missing)
        if not problems:
            raise DatasetError(f"{where}: {self.ds.path} holds no problem with a reference "
                               f"answer in column {self.answer_key!r}")
        self.problems = problems
        self.skills: tuple[str, ...] = tuple(sorted({p.skill for p in problems}))
        self.dropped_overlong = 0
        self.offset = 0
        """Epoch position (in prompts) where round 0 starts: a resumed run whose rounds changed
        size continues from its checkpointed position."""
        self._orders: dict[tuple[int, int], list[int]] = {}

    def _prompt(self, row: dict[str, Any]) -> Prompt | None:
        answer = reference_of(row[self.answer_key], self.ds.answer_form or "as_is")
        if answer is None:
            return None
        value = row[self.prompt_key]
        msgs = _chat_messages(value)
        system = [("system", self.cfg.system)] if self.cfg.system else []
        if msgs is not None:
            self.conversational = True
            if any(r == "system" for r, _ in msgs):
                system = []
            messages = system + msgs
            text = "\n\n".join(c for _, c in messages)
        else:
            try:
                user = self.cfg.prompt_template.format(**{**row, "prompt": value})
            except (KeyError, IndexError, ValueError) as err:
                raise DatasetError(f"task.prompt_template: {err!r} does not format a row of "
                                   f"{self.ds.path} (columns {sorted(row)})") from None
            messages = [*system, ("user", user)]
            text = "\n\n".join(c for _, c in messages)
        pid = (str(row[self.ds.id_key]) if self.ds.id_key else
               hashlib.sha1(text.encode()).hexdigest()[:16])
        skill = str(row[self.ds.skill_key]) if self.ds.skill_key else "all"
        return Prompt(id=pid, skill=skill.lower().replace(" ", "_"), text=text, answer=answer,
                      messages=tuple(messages))

    # ---- the shared order ----------------------------------------------------------------
    def drop_overlong(self, too_long: Sequence[Callable[[Prompt], bool]],
                      field: str = "policies[].max_prompt_tokens") -> int:
        """Drop every problem that some policy renders longer than its limit (`too_long[i]`:
        policy i's check): all policies then train on the same problems. Returns how many were
        dropped. `field`: the setting of the limit, for the message."""
        keep = [p for p in self.problems if not any(f(p) for f in too_long)]
        self.dropped_overlong += len(self.problems) - len(keep)
        if not keep:
            raise DatasetError(f"{field}: every problem of {self.ds.path} is longer than some "
                               "policy's limit")
        self.problems = keep
        self._orders.clear()
        return self.dropped_overlong

    def _order(self, seed: int, epoch: int) -> list[int]:
        key = (seed, epoch)
        if key not in self._orders:
            order = list(range(len(self.problems)))
            random.Random(f"epoch:{seed}:{epoch}").shuffle(order)
            self._orders = {key: order}  # one epoch at a time is all a run reads
        return self._orders[key]

    def position(self, round_k: int, n: int) -> tuple[int, int]:
        """(epoch, index of the round's first prompt in that epoch's order)."""
        per_epoch = len(self.problems) // n
        if per_epoch < 1:
            raise DatasetError(f"task.dataset: {len(self.problems)} problems cannot fill a "
                               f"round of {n} prompts (grpo.prompts_per_round)")
        block = self.offset // n + round_k
        return block // per_epoch, (block % per_epoch) * n

    def round_prompts(self, round_k: int, n: int, seed: int) -> list[Prompt]:
        """The prompts of round `round_k`: identical for every policy given the same `seed`."""
        epoch, start = self.position(round_k, n)
        order = self._order(seed, epoch)
        return [self.problems[i] for i in order[start:start + n]]

    def state_dict(self, round_k: int, n: int, seed: int) -> dict[str, Any]:
        """The epoch position after `round_k` rounds (saved with checkpoints)."""
        epoch, index = self.position(round_k, n)
        return {"epoch": epoch, "index": index, "problems": len(self.problems), "seed": seed,
                "prompts_per_round": n}

    def load_state_dict(self, state: dict[str, Any], round_k: int, n: int) -> None:
        """Continue at the checkpointed position (the same order, also if the round size
        changed)."""
        if int(state.get("problems", -1)) != len(self.problems):
            raise DatasetError(
                f"task.dataset: the checkpoint was taken over {state.get('problems')} problems "
                f"and {self.ds.path} now gives {len(self.problems)}: the epoch order would "
                "not continue")
        per_epoch = len(self.problems) // n
        saved = int(state["epoch"]) * per_epoch * n + int(state["index"])
        self.offset = saved - round_k * n

    # ---- the task interface ----------------------------------------------------------------
    def prompts(self, split: str, n: int | None = None, seed: int = 0) -> list[Prompt]:
        """`train`: the problems in seeded order; `heldout`: none (benchmarks evaluate)."""
        if split == "heldout":
            return []
        ps = list(self.problems)
        random.Random(f"train:{seed}").shuffle(ps)
        return ps if n is None else [ps[i % len(ps)] for i in range(n)]

    def columns(self, prompt: Prompt) -> dict[str, Any]:
        return self._rows[prompt.id]

    def sft_target(self, prompt: Prompt, rng: random.Random) -> str:
        """The row's answer column (a solution, or the bare answer)."""
        return str(self._rows[prompt.id][self.answer_key]).strip()

    def batch(self, prompts: Sequence[Prompt], samples: Sequence[Sequence[Sample]]) -> Batch:
        """The reward functions' input for samples[i][j] of prompts[i], flattened row-major."""
        flat = [(p, y) for p, row in zip(prompts, samples, strict=True) for y in row]
        cols: dict[str, list[Any]] = {}
        for p, _ in flat:
            for key, value in self._rows[p.id].items():
                cols.setdefault(key, []).append(value)
        cols["reference_answer"] = [p.answer for p, _ in flat]
        problem = [self._rows[p.id][self.prompt_key] for p, _ in flat]
        return Batch(prompts=problem, completions=[y.text for _, y in flat],
                     completion_ids=[list(y.token_ids) for _, y in flat],
                     truncated=[y.finish_reason == "length" for _, y in flat], columns=cols,
                     conversational=self.conversational)

    def score(self, prompts: Sequence[Prompt], samples: Sequence[Sequence[Sample]], tau: float
              ) -> Scored:
        """The round's rewards: a verified success is the success reward reaching tau on a
        completion that was not truncated."""
        batch = self.batch(prompts, samples)
        errors0 = dict(self.rewards.errors)
        total, per = self.rewards.score(batch)
        gate = [0.0 if t else v for v, t in
                zip(per[self.cfg.success_name], batch.truncated, strict=True)]
        stats = {f"reward/{name}": sum(v) / len(v) for name, v in per.items() if v}
        stats.update({f"reward_errors/{name}": float(n - errors0.get(name, 0))
                      for name, n in self.rewards.errors.items()})
        widths = [len(row) for row in samples]
        ok = [g >= tau and not t for g, t in zip(gate, batch.truncated, strict=True)]
        return Scored(_rows(total, widths), _rows(ok, widths),
                      _rows(gate, widths), stats)

    def reward(self, prompt: Prompt, completion_text: str, finish_reason: str) -> float:
        """One completion's summed reward (the loop scores whole rounds with `score`)."""
        return self._one(prompt, completion_text, finish_reason)[0]

    def is_correct(self, prompt: Prompt, completion_text: str, finish_reason: str,
                   tau: float = 1.0) -> bool:
        return self._one(prompt, completion_text, finish_reason, tau)[1]

    def _one(self, prompt: Prompt, text: str, finish_reason: str, tau: float = 1.0
             ) -> tuple[float, bool]:
        y = Sample(prompt_index=0, token_ids=[], text=text, offsets=[], logprobs=[],
                   finish_reason=finish_reason)
        scored = self.score([prompt], [[y]], tau)
        return scored.rewards[0][0], scored.correct[0][0]

    def check_rewards(self) -> None:
        """Call every reward function once on two samples (the first problem's reference
        solution, and an empty completion): an import that fails at call time, or an answer of
        the wrong length, stops the run before round 0."""
        p = self.problems[0]
        ys = [Sample(prompt_index=0, token_ids=[], text=t, offsets=[], logprobs=[],
                     finish_reason="stop") for t in (self.sft_target(p, random.Random(0)), "")]
        batch = self.batch([p], [ys])
        for i in range(len(self.rewards.specs)):
            self.rewards.score_one(i, batch)


def _rows(flat: Sequence[T], widths: Sequence[int]) -> list[list[T]]:
    out, at = [], 0
    for w in widths:
        out.append(list(flat[at:at + w]))
        at += w
    return out


@dataclass
class Scored:
    """A round's scores, [P][G] each."""

    rewards: list[list[float]]
    """The weighted sum of the reward functions (the policy gradient's reward)."""
    correct: list[list[bool]]
    """Verified successes."""
    success: list[list[float]] | None = None
    """The success reward (truncated samples 0): SGT's gate. None: the rewards."""
    stats: dict[str, float] = field(default_factory=dict)
    """Per-reward means and per-reward failures of the round."""


def score_round(task: Task, prompts: Sequence[Prompt], samples: Sequence[Sequence[Sample]],
                tau: float) -> Scored:
    """A round's scores, for any task: a dataset task scores the round in one call per reward
    function; the built-in tasks sample by sample."""
    if isinstance(task, DatasetTask):
        return task.score(prompts, samples, tau)
    rewards = [[task.reward(p, y.text, y.finish_reason) for y in row]
               for p, row in zip(prompts, samples, strict=True)]
    correct = [[task.is_correct(p, y.text, y.finish_reason) for y in row]
               for p, row in zip(prompts, samples, strict=True)]
    return Scored(rewards, correct)
