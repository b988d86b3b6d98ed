"""The task interface (`Task`: what the loop, the probes, SFT and evaluation need of a task;
`SyntheticTask`, `data.jsonl.JsonlTask` and `data.dataset_task.DatasetTask` have it) and the
seeded synthetic verifiable tasks (add, sub, mul, rev, sort) in two completion regimes.

Prompts look like `add:37+58=` in both regimes; only the completion differs:

- `short`: the answer and the end marker, `95;`.
- `worked`: worked steps, then `>`, the answer, `;` — e.g. `7+8=15c1,3+5+1=9>95;`. Each skill has
  three equivalent step styles; `sft_target` draws one at random so the warm-started policy sees
  varied text (what makes peer-rollout weights and THL alignment non-trivial).

A reward is 1 only when the end marker `;` was emitted and the answer matches (in `worked`, the
text after the last `>`; steps are not checked). A completion cut off by the token budget
(finish_reason "length") never counts, whatever it contains.

Held-out problems are a fixed set per skill (seeded by `heldout_seed`, not by the run seed, so
every run and every policy evaluates on the same problems) and are never produced by the train
split or by `round_prompts`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from mutualrl.trainer.config.task import DEFAULT_DIGITS, SKILLS, TaskConfig

END = ";"
SEP = ">"
# Enough budget for every completion of the default digit counts (docs/science-notes.md: 6 and 26).
MAX_NEW_TOKENS: dict[str, int] = {"short": 6, "worked": 26}


@dataclass(frozen=True)
class Prompt:
    """One problem. `id` is the same for every policy of a run (it is the problem text)."""

    id: str
    skill: str
    text: str
    """The problem as plain text (what crosses between policies; text-mode policies read it)."""
    answer: str
    messages: tuple[tuple[str, str], ...] = ()
    """The problem as chat messages, (role, content) each; empty: one user turn of `text`.
    Each policy renders them with its own chat template (mutualrl.trainer.data.chat)."""


class Task(Protocol):
    """A verifiable task: seeded problems in a round order every policy shares, SFT targets,
    the reward and the verifier."""

    skills: tuple[str, ...]
    """The skills its problems belong to (per-skill metrics)."""
    stop: list[str]
    """Stop strings of rollouts (empty: stop at EOS)."""
    max_new_tokens: int
    """The default completion budget."""

    def prompts(self, split: str, n: int | None = None, seed: int = 0) -> list[Prompt]:
        """`n` problems of `split` ("train" or "heldout"; None: all held-out ones)."""
        ...

    def round_prompts(self, round_k: int, n: int, seed: int) -> list[Prompt]:
        """The `n` problems of round `round_k`: the same for every policy of a run."""
        ...

    def sft_target(self, prompt: Prompt, rng: random.Random) -> str:
        """A completion to warm-start on."""
        ...

    def reward(self, prompt: Prompt, completion_text: str, finish_reason: str) -> float:
        """The completion's reward."""
        ...

    def is_correct(self, prompt: Prompt, completion_text: str, finish_reason: str) -> bool:
        """Whether the completion is a verified success (a truncated one never is)."""
        ...


def _digits(n: int) -> list[int]:
    """Decimal digits, least significant first."""
    return [int(c) for c in reversed(str(n))]


# ---- problem generation -------------------------------------------------------------------


def _draw(skill: str, d: int, rng: random.Random) -> tuple[str, str]:
    """One problem of `skill` at digit count `d`: (prompt text, answer)."""
    lo, hi = 10 ** (d - 1), 10**d - 1
    if skill == "add":
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        return f"add:{a}+{b}=", str(a + b)
    if skill == "sub":
        a, b = rng.randint(lo, hi), rng.randint(lo, hi)
        a, b = max(a, b), min(a, b)  # non-negative results keep the answer format simple
        return f"sub:{a}-{b}=", str(a - b)
    if skill == "mul":
        a, b = rng.randint(lo, hi), rng.randint(2, 9)
        return f"mul:{a}*{b}=", str(a * b)
    if skill in ("rev", "sort"):
        s = "".join(rng.choice("0123456789") for _ in range(d))
        ans = s[::-1] if skill == "rev" else "".join(sorted(s))
        return f"{skill}:{s}=", ans
    raise ValueError(f"unknown skill {skill!r}; expected one of {SKILLS}")


def _operands(text: str) -> tuple[str, list[str]]:
    skill, rest = text.split(":", 1)
    body = rest.rstrip("=")
    for op in "+-*":
        if op in body:
            return skill, body.split(op)
    return skill, [body]


# ---- worked steps: three equivalent styles per skill ---------------------------------------


def _add_steps(a: int, b: int, style: int) -> str:
    da, db = _digits(a), _digits(b)
    n = max(len(da), len(db))
    da, db = da + [0] * (n - len(da)), db + [0] * (n - len(db))
    if style == 2:  # place values, most significant first: 30+50=80,7+8=15
        return ",".join(
            f"{x * 10**p}+{y * 10**p}={(x + y) * 10**p}"
            for p, (x, y) in reversed(list(enumerate(zip(da, db, strict=True))))
        )
    steps, carry = [], 0
    for x, y in zip(da, db, strict=True):
        s = x + y + carry
        if style == 0:  # column sums with the carry last and a c-marker: 7+8=15c1,3+5+1=9
            parts = [str(x), str(y)] + ([str(carry)] if carry else [])
            steps.append(f"{'+'.join(parts)}={s}" + (f"c{s // 10}" if s >= 10 else ""))
        else:  # carry first, no marker: 7+8=15,1+3+5=9
            parts = ([str(carry)] if carry else []) + [str(x), str(y)]
            steps.append(f"{'+'.join(parts)}={s}")
        carry = s // 10
    return ",".join(steps)


def _sub_steps(a: int, b: int, style: int) -> str:
    da, db = _digits(a), _digits(b)
    db = db + [0] * (len(da) - len(db))
    if style == 0:  # columns with borrow markers: 1-6=5b1,9-4-1=4
        steps, borrow = [], 0
        for x, y in zip(da, db, strict=True):
            v = x - y - borrow
            nb = 1 if v < 0 else 0
            steps.append(f"{x}-{y}" + ("-1" if borrow else "") + f"={v + 10 * nb}"
                         + ("b1" if nb else ""))
            borrow = nb
        return ",".join(steps)
    if style == 1:  # running remainder, high to low: 91-40=51,51-6=45
        steps, cur = [], a
        for p in reversed(range(len(db))):
            part = db[p] * 10**p
            steps.append(f"{cur}-{part}={cur - part}")
            cur -= part
        return ",".join(steps)
    # place-value differences then their sum: 90-40=50,1-6=-5,50+-5=45
    diffs = [(x - y) * 10**p for p, (x, y) in enumerate(zip(da, db, strict=True))][::-1]
    steps = [
        f"{x * 10**p}-{y * 10**p}={(x - y) * 10**p}"
        for p, (x, y) in reversed(list(enumerate(zip(da, db, strict=True))))
    ]
    steps.append(f"{'+'.join(str(v) for v in diffs)}={a - b}")
    return ",".join(steps)


def _mul_steps(a: int, b: int, style: int) -> str:
    da = _digits(a)
    if style == 0:  # columns with carry: 3*7=21c2,2*7+2=16
        steps, carry = [], 0
        for x in da:
            s = x * b + carry
            steps.append(f"{x}*{b}" + (f"+{carry}" if carry else "") + f"={s}"
                         + (f"c{s // 10}" if s >= 10 else ""))
            carry = s // 10
        return ",".join(steps)
    parts = [x * 10**p * b for p, x in enumerate(da)]
    if style == 1:  # place values high to low, then the sum: 20*7=140,3*7=21,140+21=161
        steps = [f"{x * 10**p}*{b}={x * 10**p * b}" for p, x in reversed(list(enumerate(da)))]
        steps.append(f"{'+'.join(str(v) for v in reversed(parts))}={a * b}")
        return ",".join(steps)
    # commuted, low to high: 7*3=21,7*20=140,21+140=161
    steps = [f"{b}*{x * 10**p}={x * 10**p * b}" for p, x in enumerate(da)]
    steps.append(f"{'+'.join(str(v) for v in parts)}={a * b}")
    return ",".join(steps)


def _rev_steps(s: str, style: int) -> str:
    r = s[::-1]
    if style == 2:  # pairs: 17,83
        return ",".join(r[i : i + 2] for i in range(0, len(r), 2))
    return ("," if style == 0 else ".").join(r)  # 1,7,8,3 or 1.7.8.3


def _sort_steps(s: str, style: int) -> str:
    if style == 2:  # insertion: sorted prefixes 5,15,159,1359
        return ",".join("".join(sorted(s[: i + 1])) for i in range(len(s)))
    return ("," if style == 0 else ".").join(sorted(s))  # 1,3,5,9 or 1.3.5.9


N_STYLES = 3


def worked_steps(prompt: Prompt, style: int) -> str:
    """The steps (without `>answer;`) of `prompt` in step style 0, 1 or 2."""
    if not 0 <= style < N_STYLES:
        raise ValueError(f"style must be in [0, {N_STYLES})")
    skill, ops = _operands(prompt.text)
    if skill in ("add", "sub", "mul"):
        a, b = int(ops[0]), int(ops[1])
        fn: Callable[[int, int, int], str] = {"add": _add_steps, "sub": _sub_steps,
                                              "mul": _mul_steps}[skill]
        return fn(a, b, style)
    return (_rev_steps if skill == "rev" else _sort_steps)(ops[0], style)


# ---- the task --------------------------------------------------------------------------------


class SyntheticTask:
    """A synthetic task: seeded prompts, paired round order, SFT targets and the verifier."""

    def __init__(self, cfg: TaskConfig | None = None, **overrides: object) -> None:
        # Overrides go through validation too (`SyntheticTask(regime="worked")` is checked
        # like YAML).
        cfg = TaskConfig.model_validate({**(cfg or TaskConfig()).model_dump(), **overrides})
        for s in cfg.skills:
            if s not in SKILLS:
                raise ValueError(f"unknown skill {s!r}; expected a subset of {SKILLS}")
        if not cfg.skills:
            raise ValueError("a task needs at least one skill")
        self.cfg = cfg
        self.regime: str = cfg.regime
        self.skills: tuple[str, ...] = tuple(cfg.skills)
        self.digits = {**DEFAULT_DIGITS, **cfg.digits}
        # Stop strings and token budget the rollout engine should use for this task.
        self.stop: list[str] = [END]
        self.max_new_tokens: int = MAX_NEW_TOKENS[cfg.regime]
        self._heldout = {s: self._make_heldout(s) for s in self.skills}
        self._heldout_ids = {p.id for ps in self._heldout.values() for p in ps}

    def _make_heldout(self, skill: str) -> list[Prompt]:
        d = self.digits[skill]
        rng = random.Random(f"heldout:{self.cfg.heldout_seed}:{skill}:{d}")
        seen: dict[str, Prompt] = {}
        tries = 0
        while len(seen) < self.cfg.heldout_per_skill:
            text, ans = _draw(skill, d, rng)
            seen.setdefault(text, Prompt(id=text, skill=skill, text=text, answer=ans))
            tries += 1
            if tries > 50 * self.cfg.heldout_per_skill:
                raise ValueError(f"{skill} at {d} digits has too few problems for the held-out set")
        return list(seen.values())

    def _train_prompt(self, skill: str, rng: random.Random) -> Prompt:
        # Rejection keeps train and held-out disjoint; the held-out share of each problem space
        # is small at the default digit counts, so this loops about once.
        for _ in range(10_000):
            text, ans = _draw(skill, self.digits[skill], rng)
            if text not in self._heldout_ids:
                return Prompt(id=text, skill=skill, text=text, answer=ans)
        raise RuntimeError(f"could not draw a train problem for {skill}")

    def prompts(self, split: str, n: int | None = None, seed: int = 0) -> list[Prompt]:
        """`n` prompts of `split`, skills interleaved (a uniform mix).

        "heldout": the fixed held-out set, round-robin over skills (`seed` unused, so every run
        evaluates on the same problems); `n=None` returns all of it. "train": `n` fresh draws
        from `seed`, never a held-out problem (repeats across draws are possible).
        """
        if split == "heldout":
            per = [self._heldout[s] for s in self.skills]
            out = [p for group in zip(*per, strict=True) for p in group]
            return out if n is None else out[:n]
        if split == "train":
            if n is None:
                raise ValueError("the train split needs n")
            rng = random.Random(f"train:{seed}")
            return [self._train_prompt(self.skills[i % len(self.skills)], rng) for i in range(n)]
        raise ValueError(f"unknown split {split!r}; expected 'train' or 'heldout'")

    def round_prompts(self, round_k: int, n: int, seed: int) -> list[Prompt]:
        """Prompts of RL round `round_k`: identical for every policy given the same `seed`.

        Uniform skill mix (counts differ by at most one; the extra ones rotate with the round),
        in a shuffled order.
        """
        rng = random.Random(f"round:{seed}:{round_k}")
        k = len(self.skills)
        skills = [self.skills[(round_k + i) % k] for i in range(n)]
        out = [self._train_prompt(s, rng) for s in skills]
        rng.shuffle(out)
        return out

    def sft_target(self, prompt: Prompt, rng: random.Random) -> str:
        """A correct completion for warm start (worked regime: a random one of three styles)."""
        if self.regime == "short":
            return f"{prompt.answer}{END}"
        style = rng.randrange(N_STYLES)
        return f"{worked_steps(prompt, style)}{SEP}{prompt.answer}{END}"

    def extract(self, completion_text: str) -> str | None:
        """The answer a completion commits to, or None if it never emitted the end marker."""
        if END not in completion_text:
            return None
        body = completion_text.split(END, 1)[0]
        if self.regime == "worked":
            if SEP not in body:
                return None
            body = body.rsplit(SEP, 1)[1]
        return body.strip()

    def reward(self, prompt: Prompt, completion_text: str, finish_reason: str) -> float:
        """1.0 if verified correct, `format_reward` if well-formed but wrong, else 0.0."""
        if finish_reason != "stop":
            return 0.0  # truncated output never counts as verified
        got = self.extract(completion_text)
        if got is None:
            return 0.0
        return 1.0 if got == prompt.answer else float(self.cfg.format_reward)

    def is_correct(self, prompt: Prompt, completion_text: str, finish_reason: str) -> bool:
        """Verified success (ignores any format reward)."""
        return finish_reason == "stop" and self.extract(completion_text) == prompt.answer


def corpus(task: SyntheticTask, n_per_skill: int = 400, seed: int = 0) -> list[str]:
    """Prompt + completion texts of `task` (all step styles), e.g. to train a tokenizer on."""
    rng = random.Random(f"corpus:{seed}")
    out: list[str] = []
    for p in task.prompts("train", n_per_skill * len(task.skills), seed=seed):
        out.append(p.text + task.sft_target(p, rng))
    return out


def skill_mix(prompts: Sequence[Prompt]) -> dict[str, int]:
    """How many prompts of each skill (for checking a uniform mix)."""
    counts: dict[str, int] = {}
    for p in prompts:
        counts[p.skill] = counts.get(p.skill, 0) + 1
    return counts
