"""The `task:` section: a seeded synthetic task, a JSONL file, or a local table read through
`datasets` with reward functions (mutualrl.trainer.data holds the tasks these configure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from mutualrl.common.config import Config

# ---- the synthetic task (mutualrl.trainer.data.tasks) -----------------------------------------

SKILLS: tuple[str, ...] = ("add", "sub", "mul", "rev", "sort")
DEFAULT_SKILLS: tuple[str, ...] = ("add", "sub", "rev", "sort")

# Digit count per skill: operand digits for add/sub, first-operand digits for mul (the second is
# one digit, 2-9), string length for rev/sort. Raising them is the difficulty knob.
DEFAULT_DIGITS: dict[str, int] = {"add": 2, "sub": 2, "mul": 2, "rev": 4, "sort": 4}
Regime = Literal["short", "worked"]


class TaskConfig(Config):
    """Which synthetic task a run trains and evaluates on."""

    regime: Regime = Field("short", description="Completion format: `short` or `worked`.")
    skills: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SKILLS),
        description=f"Skills in the task mix, a subset of {SKILLS}.",
    )
    digits: dict[str, int] = Field(
        default_factory=dict,
        description="Per-skill digit count overrides (difficulty); missing skills use "
        f"{DEFAULT_DIGITS}.",
    )
    heldout_per_skill: int = Field(250, description="Held-out problems per skill.")
    heldout_seed: int = Field(
        20240607, description="Seed of the held-out set; fixed across runs so results compare."
    )
    format_reward: float = Field(
        0.0,
        description="Reward for a well-formed but wrong completion (marker emitted, and in the "
        "worked regime a `>` before it). 0 gives the plain binary reward.",
    )


# ---- a JSONL file (mutualrl.trainer.data.jsonl) ---------------------------------------------


class JsonlTaskConfig(Config):
    """A verifiable task read from JSONL files."""

    path: Path = Field(description="JSONL file of problems (the train split, or everything).")
    heldout_path: Path | None = Field(
        None, description="Optional JSONL file of held-out problems; else a hash split of `path`."
    )
    form: Literal["auto", "gsm8k", "math"] = Field(
        "auto", description="Record/answer form; `auto` decides per record from its fields."
    )
    heldout_fraction: float = Field(
        0.1, description="Share of `path` held out when no `heldout_path` is given."
    )
    prompt_template: str = Field(
        "Question: {question}\nAnswer:", description="How a question becomes a prompt text."
    )
    format_reward: float = Field(
        0.0,
        description="Reward for a completion that states an answer in the expected form "
        "(`#### x` or `\\boxed{x}`) but a wrong one. 0 gives the plain binary reward.",
    )
    fallback_last_number: bool = Field(
        False, description="Without an answer marker, verify the last number in the completion."
    )
    stop: list[str] = Field(
        default_factory=list, description="Stop strings for rollouts (empty: stop at EOS)."
    )
    max_new_tokens: int = Field(256, description="Token budget for rollouts on this task.")


# ---- a local table with reward functions (mutualrl.trainer.data.dataset_task) ----------------

AnswerForm = Literal["as_is", "gsm8k", "boxed"]

# The column names of today's GSM8K and MATH files (their JSONL and parquet releases agree).
PRESETS: dict[str, dict[str, Any]] = {
    "gsm8k": {"prompt_key": "question", "answer_key": "answer", "answer_form": "gsm8k"},
    "math": {"prompt_key": "problem", "answer_key": "solution", "answer_form": "boxed",
             "skill_key": "type"},
}


BUILTIN_REWARDS: tuple[str, ...] = ("math_verify", "boxed_format", "final_number", "overlong")
"""The built-in reward functions' names (mutualrl.trainer.data.rewards.BUILTINS holds them)."""


class RewardSpec(Config):
    """One reward function of `task.rewards`."""

    fn: str = Field(min_length=1)
    """A built-in (`math_verify`, `boxed_format`, `final_number`, `overlong`), `module:callable`
    (importable), or `path/to/file.py:callable` (relative to the working directory)."""
    weight: float = 1.0
    """Its weight in the summed reward."""
    name: str | None = None
    """Its name in metrics and in `task.success_reward` (default: the built-in's or the
    callable's name)."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments bound to the function (e.g. `overlong`'s `buffer_tokens`)."""

    @property
    def label(self) -> str:
        return self.name or self.fn.rsplit(":", 1)[-1]

    @field_validator("fn")
    @classmethod
    def _known_form(cls, v: str) -> str:
        if v not in BUILTIN_REWARDS and ":" not in v:
            raise ValueError(f"{v!r} is neither a built-in ({', '.join(sorted(BUILTIN_REWARDS))}) "
                             "nor `module:callable` nor `file.py:callable`")
        return v


class DatasetSettings(Config):
    """Which table, and which of its columns mean what."""

    path: Path
    """A parquet / arrow / json / jsonl / csv file, a folder of such files, or a directory
    written by `Dataset.save_to_disk`."""
    split: str = "train"
    """The split to read (a `save_to_disk` DatasetDict's or a folder's; a single file is
    read as this split)."""
    preset: Literal["gsm8k", "math"] | None = None
    """Column names and answer form of GSM8K (question / answer, `#### x`) or MATH (problem /
    solution, `\\boxed{x}`, skill from `type`); fields given here win over it."""
    prompt_key: str | None = None
    """Column of the problem: text, or chat messages (list of {role, content}). Default
    `prompt`."""
    answer_key: str | None = None
    """Column of the reference answer or solution. Default `answer`."""
    answer_form: AnswerForm | None = None
    """How the reference answer is read from the answer column: `as_is`, `gsm8k` (after
    `####`) or `boxed` (the last `\\boxed{}`). Default `as_is`."""
    skill_key: str | None = None
    """Optional column naming each problem's skill (per-skill metrics)."""
    id_key: str | None = None
    """Optional column of unique problem ids (default: a hash of the problem text)."""
    limit: int | None = Field(None, ge=1)
    """Read only the first N rows."""

    def resolved(self) -> DatasetSettings:
        """The settings with the preset's and the defaults' columns filled in."""
        base = {"prompt_key": "prompt", "answer_key": "answer", "answer_form": "as_is",
                **PRESETS.get(self.preset or "", {})}
        given = self.model_dump(exclude_none=True)
        return DatasetSettings.model_validate({**base, **given})


class DatasetTaskConfig(Config):
    """A verifiable task from a local table, scored by reward functions."""

    dataset: DatasetSettings
    """The training table."""
    system: str | None = None
    """A system prompt put before every problem (chat policies; text policies read it as a
    first paragraph)."""
    prompt_template: str = "{prompt}"
    """How a text problem becomes the user turn: a `str.format` template over the row's columns,
    with `{prompt}` the prompt column."""
    rewards: list[RewardSpec] = Field(
        default_factory=lambda: [RewardSpec(fn="math_verify")], min_length=1)
    """Reward functions; a sample's reward is their weighted sum."""
    success_reward: str | None = None
    """The reward whose value reaching `probe.tau` makes a verified success (what SGT shares
    and SEE counts; truncated completions never count). Default: the first of `rewards`."""
    reward_timeout_s: float = Field(30.0, gt=0)
    """Longest one reward call may take; the samples of a call that overruns are retried alone,
    and those that overrun again score 0 (metric `reward_errors/<name>`)."""
    stop: list[str] = Field(default_factory=list)
    """Stop strings for rollouts (empty: stop at EOS)."""
    max_new_tokens: int = Field(256, ge=1)
    """Token budget for rollouts on this task."""

    @model_validator(mode="after")
    def _success_is_a_reward(self) -> DatasetTaskConfig:
        names = [r.label for r in self.rewards]
        if self.success_reward is not None and self.success_reward not in names:
            raise ValueError(f"task.success_reward: {self.success_reward!r} is not one of "
                             f"task.rewards {names}")
        return self

    @property
    def success_name(self) -> str:
        return self.success_reward or self.rewards[0].label
