"""User datasets from local JSONL files (GSM8K or MATH form) behind the `Task` interface.

GSM8K form: `{"question": ..., "answer": "... reasoning ...\\n#### 72"}`.
MATH form: `{"problem": ..., "solution": "... \\boxed{\\frac{1}{2}} ...", "type": "Algebra"}`
(an explicit `"answer"` field, when present and not a GSM8K solution, is used as the reference).

Nothing is downloaded: point `path` (and optionally `heldout_path`) at files you have. Without a
held-out file a fixed hash of each record's id decides its split, so the split is the same in
every run and for every policy.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from mutualrl.trainer.config.task import JsonlTaskConfig
from mutualrl.trainer.data.answers import after_hashes, answers_match, last_boxed, last_number
from mutualrl.trainer.data.tasks import Prompt


def _form_of(rec: dict, form: str) -> str:
    if form != "auto":
        return form
    if "problem" in rec or "solution" in rec:
        return "math"
    return "gsm8k"


def _record_to_prompt(rec: dict, form: str, template: str) -> tuple[Prompt, str]:
    """(prompt, reference solution text) of one JSONL record."""
    f = _form_of(rec, form)
    if f == "gsm8k":
        question, solution = rec["question"], rec["answer"]
        answer = after_hashes(solution)
        skill = str(rec.get("skill", "gsm8k"))
    else:
        question = rec["problem"]
        solution = rec.get("solution", "")
        answer = rec.get("answer") or last_boxed(solution)
        skill = str(rec.get("type", rec.get("skill", "math"))).lower().replace(" ", "_")
    if not answer:
        raise ValueError(f"record has no reference answer: {str(rec)[:120]}")
    rid = str(rec.get("id") or rec.get("unique_id") or
              hashlib.sha1(question.encode()).hexdigest()[:16])
    text = template.format(question=question)
    return Prompt(id=rid, skill=skill, text=text, answer=str(answer)), solution


def read_jsonl(path: Path, form: str = "auto",
               template: str = "{question}") -> list[tuple[Prompt, str]]:
    """Every record of a JSONL file as (prompt, solution); blank lines are skipped."""
    out = []
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                out.append(_record_to_prompt(json.loads(line), form, template))
            except (KeyError, json.JSONDecodeError) as e:
                raise ValueError(f"{path}:{line_no}: bad record ({e})") from e
    return out


def _in_heldout(pid: str, fraction: float) -> bool:
    h = int(hashlib.sha1(pid.encode()).hexdigest()[:8], 16)
    return h / 0xFFFFFFFF < fraction


class JsonlTask:
    """GSM8K/MATH problems with the same methods as `tasks.Task`."""

    def __init__(self, cfg: JsonlTaskConfig) -> None:
        self.cfg = cfg
        records = read_jsonl(cfg.path, cfg.form, cfg.prompt_template)
        if cfg.heldout_path is not None:
            train = records
            heldout = read_jsonl(cfg.heldout_path, cfg.form, cfg.prompt_template)
        else:
            train = [r for r in records if not _in_heldout(r[0].id, cfg.heldout_fraction)]
            heldout = [r for r in records if _in_heldout(r[0].id, cfg.heldout_fraction)]
        held_ids = {p.id for p, _ in heldout}
        # A problem present in both files only counts as held out.
        self._train = [r for r in train if r[0].id not in held_ids]
        self._heldout = heldout
        if not self._train:
            raise ValueError(f"{cfg.path}: no training problems")
        self._solutions = {p.id: s for p, s in [*self._train, *self._heldout]}
        self.skills: tuple[str, ...] = tuple(sorted({p.skill for p, _ in self._train}))
        self._by_skill = {s: [p for p, _ in self._train if p.skill == s] for s in self.skills}
        self.stop: list[str] = list(cfg.stop)
        self.max_new_tokens: int = cfg.max_new_tokens
        self.regime = "jsonl"

    def prompts(self, split: str, n: int | None = None, seed: int = 0) -> list[Prompt]:
        """Held-out: file order (`seed` unused). Train: a seeded shuffle, cycled to `n`."""
        if split == "heldout":
            ps = [p for p, _ in self._heldout]
            return ps if n is None else ps[:n]
        if split != "train":
            raise ValueError(f"unknown split {split!r}; expected 'train' or 'heldout'")
        ps = [p for p, _ in self._train]
        random.Random(f"train:{seed}").shuffle(ps)
        if n is None:
            return ps
        return [ps[i % len(ps)] for i in range(n)]

    def round_prompts(self, round_k: int, n: int, seed: int) -> list[Prompt]:
        """Identical for every policy of a run; skills (problem types) in a uniform mix."""
        rng = random.Random(f"round:{seed}:{round_k}")
        out = [rng.choice(self._by_skill[self.skills[(round_k + i) % len(self.skills)]])
               for i in range(n)]
        rng.shuffle(out)
        return out

    def sft_target(self, prompt: Prompt, rng: random.Random) -> str:
        """The reference solution of the record (`rng` unused: one solution per problem)."""
        return " " + self._solutions[prompt.id].strip()

    def extract(self, completion_text: str) -> tuple[str | None, bool]:
        """(answer, whether it was stated in the expected form)."""
        for fn in (after_hashes, last_boxed):
            got = fn(completion_text)
            if got is not None:
                return got, True
        if self.cfg.fallback_last_number:
            return last_number(completion_text), False
        return None, False

    def reward(self, prompt: Prompt, completion_text: str, finish_reason: str) -> float:
        """1.0 if the answer matches, `format_reward` if well-formed but wrong, else 0.0."""
        if finish_reason != "stop":
            return 0.0  # truncated output never counts as verified
        got, formatted = self.extract(completion_text)
        if answers_match(got, prompt.answer):
            return 1.0
        return float(self.cfg.format_reward) if formatted else 0.0

    def is_correct(self, prompt: Prompt, completion_text: str, finish_reason: str) -> bool:
        """Verified success (ignores any format reward)."""
        return finish_reason == "stop" and answers_match(
            self.extract(completion_text)[0], prompt.answer)
