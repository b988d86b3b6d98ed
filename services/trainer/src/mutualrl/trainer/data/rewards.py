"""Reward functions: built-ins and the user's own, with TRL's signature, weighted and summed.

A reward function is called as TRL calls its `reward_funcs`:

    fn(prompts=[...], completions=[...], completion_ids=[...], **columns) -> list[float | None]

one entry per completion. `prompts` hold each problem as the dataset gave it (text, or chat
messages); `completions` the completion text (for chat-message prompts, TRL's conversational
form `[{"role": "assistant", "content": text}]`); `columns` every column of the dataset row
(one list per column), plus `reference_answer` (the reference the task extracted from the answer
column) and `truncated` (the completion ran out of tokens). None counts as 0 in the sum.

One call scores a round. A call that raises or overruns `timeout_s` is repeated sample by sample,
so only the samples that fail get 0 (counted in `reward_errors/<name>`). A call that returns the
wrong number of values is a bug of the function, and stops the trainer naming it.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import importlib
import importlib.util
import logging
import math
import re
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mutualrl.common.bounds import MAX_ABS_REWARD
from mutualrl.trainer.config.task import RewardSpec
from mutualrl.trainer.data.answers import after_hashes, answers_match, last_boxed, last_number

log = logging.getLogger(__name__)


class _OwnTimeout(logging.Filter):
    """math-verify warns that its signal-based timeouts are off: the reward call's timeout
    (RewardSet.timeout_s) is what bounds it here, so the warning would mislead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_OwnTimeout())
RewardFn = Callable[..., Sequence[float | None]]


class RewardError(ValueError):
    """A reward function that cannot be loaded, or answers with the wrong number of values."""


# ---- built-ins ---------------------------------------------------------------------------------


def _text(completion: Any) -> str:
    """A completion's text from either TRL form (a string, or a list of messages)."""
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content", "")) for m in completion)


def _gold(reference: str) -> list[Any]:
    """The parsed reference: a bare answer (`\\frac{1}{2}`, `(1,2]`, `72`) is read as LaTeX
    math; a solution text with its own `\\boxed{}` or `$...$` is parsed as it stands."""
    from math_verify import parse

    for text in (reference, f"${reference}$"):
        gold = parse(text, parsing_timeout=None)  # the reward call's own timeout bounds it
        if gold:
            return list(gold)
    return []


def math_verify(completions: Sequence[Any], reference_answer: Sequence[str],
                truncated: Sequence[bool] | None = None, **_: Any) -> list[float]:
    """1 when math-verify finds the completion's answer equivalent to the reference (symbolic:
    `\\sqrt{2}/2` = `\\frac{\\sqrt{2}}{2}`, intervals, sets, matrices), else 0. Truncated
    completions score 0."""
    from math_verify import parse, verify

    out = []
    for i, (c, ref) in enumerate(zip(completions, reference_answer, strict=True)):
        if truncated is not None and truncated[i]:
            out.append(0.0)
            continue
        gold, pred = _gold(str(ref)), parse(_text(c), parsing_timeout=None)
        ok = bool(gold and pred and verify(gold, pred, timeout_seconds=None))
        out.append(1.0 if ok else 0.0)
    return out


_BOXED = re.compile(r"\\(boxed|fbox)\s*\{")


def boxed_format(completions: Sequence[Any], **_: Any) -> list[float]:
    """1 when the completion states an answer in `\\boxed{...}`, else 0."""
    return [1.0 if _BOXED.search(_text(c)) and last_boxed(_text(c)) else 0.0
            for c in completions]


def final_number(completions: Sequence[Any], reference_answer: Sequence[str],
                 truncated: Sequence[bool] | None = None, **_: Any) -> list[float]:
    """GSM8K's check: the number after `####`, else in the last `\\boxed{}`, else the last
    number of the completion, equals the reference number (`1,000` = `1000` = `1000.0`)."""
    out = []
    for i, (c, ref) in enumerate(zip(completions, reference_answer, strict=True)):
        text = _text(c)
        got = after_hashes(text) or last_boxed(text) or last_number(text)
        ok = not (truncated is not None and truncated[i]) and answers_match(got, str(ref))
        out.append(1.0 if ok else 0.0)
    return out


def overlong(completion_ids: Sequence[Sequence[int]], max_tokens: int, buffer_tokens: int,
             **_: Any) -> list[float]:
    """DAPO's soft overlong penalty: 0 up to `max_tokens - buffer_tokens` tokens, then falling
    linearly to -1 at `max_tokens` (and -1 beyond)."""
    if buffer_tokens < 1 or buffer_tokens > max_tokens:
        raise RewardError(f"overlong: buffer_tokens={buffer_tokens} must be in [1, max_tokens="
                          f"{max_tokens}]")
    start = max_tokens - buffer_tokens
    return [max(-1.0, min(0.0, (start - len(ids)) / buffer_tokens)) for ids in completion_ids]


BUILTINS: dict[str, RewardFn] = {
    "math_verify": math_verify, "boxed_format": boxed_format, "final_number": final_number,
    "overlong": overlong,
}


def load_fn(spec: RewardSpec, max_new_tokens: int) -> RewardFn:
    """The callable `spec.fn` names, with `spec.args` bound (`overlong`'s `max_tokens` defaults
    to the task's token budget)."""
    where = f"task.rewards[{spec.label}].fn"
    if spec.fn in BUILTINS:
        fn: Any = BUILTINS[spec.fn]
        if spec.fn == "overlong":
            args = {"max_tokens": max_new_tokens, **spec.args}
            if "buffer_tokens" not in args:
                raise RewardError(f"{where}: overlong needs args.buffer_tokens")
            return functools.partial(fn, **args)
    else:
        target, _, attr = spec.fn.rpartition(":")
        try:
            module = _import(target)
        except Exception as err:
            raise RewardError(f"{where}: cannot import {target!r}: {type(err).__name__}: {err}"
                              ) from err
        fn = getattr(module, attr, None)
        if not callable(fn):
            raise RewardError(f"{where}: {target!r} has no callable {attr!r}")
    return functools.partial(fn, **spec.args) if spec.args else fn


def _import(target: str) -> Any:
    if not target.endswith(".py"):
        return importlib.import_module(target)
    path = Path(target).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no file {path}")
    name = f"mutualrl_reward_{abs(hash(str(path)))}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # pickling and dataclasses inside the file look it up
    spec.loader.exec_module(module)
    return module


# ---- calling them --------------------------------------------------------------------------


@dataclass
class Batch:
    """What one scoring call hands every reward function (one entry per completion)."""

    prompts: list[Any]
    completions: list[str]
    completion_ids: list[list[int]]
    truncated: list[bool]
    columns: dict[str, list[Any]] = field(default_factory=dict)
    """Dataset columns, plus `reference_answer`."""
    conversational: bool = False

    def __len__(self) -> int:
        return len(self.completions)

    def kwargs(self, idx: Sequence[int] | None = None) -> dict[str, Any]:
        def pick(xs: list[Any]) -> list[Any]:
            return xs if idx is None else [xs[i] for i in idx]

        comps: list[Any] = pick(self.completions)
        if self.conversational:
            comps = [[{"role": "assistant", "content": c}] for c in comps]
        return {**{k: pick(v) for k, v in self.columns.items()}, "prompts": pick(self.prompts),
                "completions": comps, "completion_ids": pick(self.completion_ids),
                "truncated": pick(self.truncated)}


class RewardSet:
    """The task's reward functions: weighted sum, per-reward values, and a call timeout."""

    def __init__(self, specs: Sequence[RewardSpec], max_new_tokens: int,
                 timeout_s: float = 30.0) -> None:
        labels = [s.label for s in specs]
        if len(set(labels)) != len(labels):
            raise RewardError(f"task.rewards: names must be unique, got {labels}; give `name`")
        self.specs = list(specs)
        self.fns = [load_fn(s, max_new_tokens) for s in specs]
        self.timeout_s = timeout_s
        self.errors: dict[str, int] = {s.label: 0 for s in specs}
        """Samples scored 0 because the function raised or overran, per reward (cumulative)."""

    def _call(self, fn: RewardFn, kwargs: Mapping[str, Any]) -> Sequence[float | None]:
        # A thread cannot be stopped: an overrun call is abandoned to finish in the background
        # on its own daemon thread (which never holds the trainer's exit up), so one stuck
        # sample never blocks the round.
        fut: cf.Future[Sequence[float | None]] = cf.Future()

        def run() -> None:
            try:
                fut.set_result(fn(**kwargs))
            except BaseException as err:  # handed to the caller, which decides
                fut.set_exception(err)

        threading.Thread(target=run, name="reward", daemon=True).start()
        try:
            return fut.result(timeout=self.timeout_s)
        except cf.TimeoutError:
            raise TimeoutError(f"overran {self.timeout_s} s") from None

    def _checked(self, label: str, values: Any, n: int) -> list[float]:
        if not isinstance(values, Sequence) or isinstance(values, str) or len(values) != n:
            got = len(values) if isinstance(values, Sequence) else type(values).__name__
            raise RewardError(f"task.rewards[{label}]: returned {got} values for {n} "
                              "completions (one float or None per completion)")
        out = []
        for v in values:
            f = 0.0 if v is None else float(v)
            if abs(f) > MAX_ABS_REWARD and math.isfinite(f):
                raise RewardError(f"task.rewards[{label}]: returned {f:g}, beyond the "
                                  f"+-{MAX_ABS_REWARD:g} a shared reward may hold "
                                  "(mutualrl.common.bounds): scale it down")
            out.append(f if math.isfinite(f) else 0.0)
        return out

    def score_one(self, i: int, batch: Batch) -> list[float]:
        """Reward `i`'s values for the batch (0 where it failed on a sample)."""
        spec, fn, n = self.specs[i], self.fns[i], len(batch)
        try:
            return self._checked(spec.label, self._call(fn, batch.kwargs()), n)
        except RewardError:
            raise
        except Exception:
            pass  # find the samples it fails on: only they score 0
        out: list[float] = []
        failed: list[str] = []
        for j in range(n):
            try:
                out += self._checked(spec.label, self._call(fn, batch.kwargs([j])), 1)
            except RewardError:
                raise
            except Exception as err:
                failed.append(f"{type(err).__name__}: {err}")
                out.append(0.0)
        if failed:
            self.errors[spec.label] += len(failed)
            log.warning("reward %s failed on %d of %d samples (scored 0); first: %s",
                        spec.label, len(failed), n, failed[0])
        return out

    def score(self, batch: Batch) -> tuple[list[float], dict[str, list[float]]]:
        """(weighted sum per completion, each reward's values by name)."""
        per = {s.label: self.score_one(i, batch) for i, s in enumerate(self.specs)}
        total = [sum(s.weight * per[s.label][j] for s in self.specs) for j in range(len(batch))]
        for t in total:
            if not abs(t) <= MAX_ABS_REWARD:
                terms = " + ".join(f"{s.weight:g} x {s.label}" for s in self.specs)
                raise RewardError(f"task.rewards: the weighted total ({terms}) is {t:g}, beyond "
                                  f"the +-{MAX_ABS_REWARD:g} a shared reward may hold "
                                  "(mutualrl.common.bounds): lower the weights")
        return total, per
