"""Warm start by supervised fine-tuning: strong skills learned, weak skills barely seen.

The probe experiment needs complementary policies: each is strong on some skills and starts
near 0% on the others (docs/science-notes.md: a weak skill at 27% lets plain GRPO catch up on
its own). So SFT trains on fresh problems of the *strong* skills, and the weak skills appear
only through a tiny fixed pool (a few examples, a few percent of the examples): enough to learn
the format, not the skill. The result is a `save_pretrained` directory that `load_policy` (and
therefore `TrainerConfig.policies[].sft_checkpoint`) loads, plus `sft_eval.json` with per-skill
held-out accuracy under greedy decoding, to check the starting point before RL.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from transformers import PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from mutualrl.trainer.config.sft import SFTConfig
from mutualrl.trainer.config.task import TaskConfig
from mutualrl.trainer.data.chat import PromptRenderer
from mutualrl.trainer.data.tasks import Prompt, SyntheticTask
from mutualrl.trainer.engines.hf import HFEngine
from mutualrl.trainer.runtime.presets import ensure_preset, load_policy

EVAL_FILE = "sft_eval.json"


def pack_batch(tok: PreTrainedTokenizerBase, pairs: list[tuple[list[int], list[int]]],
               device: torch.device) -> dict[str, torch.Tensor]:
    """(prompt ids, completion ids) pairs as a right-padded batch whose loss covers the
    completion tokens only."""
    width = max(len(p) + len(c) for p, c in pairs)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.full((len(pairs), width), pad, dtype=torch.long)
    labels = torch.full((len(pairs), width), -100, dtype=torch.long)
    attn = torch.zeros((len(pairs), width), dtype=torch.long)
    for i, (p, c) in enumerate(pairs):
        seq = p + c
        ids[i, : len(seq)] = torch.tensor(seq)
        labels[i, len(p) : len(seq)] = torch.tensor(c)
        attn[i, : len(seq)] = 1
    return {"input_ids": ids.to(device), "attention_mask": attn.to(device),
            "labels": labels.to(device)}


def completion_ids(tok: PreTrainedTokenizerBase, target: str, append_eos: bool) -> list[int]:
    """A target completion's tokens, encoded on its own (never merged with the prompt)."""
    ids = list(tok(target, add_special_tokens=False)["input_ids"])
    if append_eos and tok.eos_token_id is not None:
        ids.append(tok.eos_token_id)
    return ids


def renderer(cfg: SFTConfig, tok: PreTrainedTokenizerBase) -> PromptRenderer:
    """The prompts' rendering: the same code, and the same settings, as the RL policy's."""
    return PromptRenderer(tok, "sft", cfg.prompt_format, cfg.chat_template,
                          cfg.chat_template_kwargs)


def evaluate(model: PreTrainedModel, tok: PreTrainedTokenizerFast, task: SyntheticTask,
             per_skill: int,
             render: PromptRenderer | None = None) -> dict[str, float]:
    """Per-skill held-out accuracy with greedy decoding through HFEngine (+ "mean")."""
    prompts = task.prompts("heldout", per_skill * len(task.skills))
    render = render or PromptRenderer(tok, "sft")
    engine = HFEngine(model, tok)
    hits: dict[str, list[float]] = {s: [] for s in task.skills}
    for start in range(0, len(prompts), 256):
        chunk = prompts[start : start + 256]
        out = engine.generate(render.many(chunk), n=1, max_new_tokens=task.max_new_tokens,
                              temperature=0.0, stop=task.stop)
        for p, (s,) in zip(chunk, out, strict=True):
            hits[p.skill].append(float(task.is_correct(p, s.text, s.finish_reason)))
    acc = {k: round(sum(v) / len(v), 4) for k, v in hits.items()}
    acc["mean"] = round(sum(acc.values()) / len(acc), 4)
    return acc


class _Data:
    """Seeded stream of (prompt ids, completion ids): strong skills fresh, weak from a pool."""

    def __init__(self, cfg: SFTConfig, tok: PreTrainedTokenizerBase) -> None:
        self.cfg, self.tok = cfg, tok
        self.render = renderer(cfg, tok)
        self.rng = random.Random(f"sft:{cfg.seed}")
        base = cfg.task.model_dump()
        self.strong = SyntheticTask(
            TaskConfig.model_validate({**base, "skills": cfg.strong_skills}))
        self.append_eos = not self.strong.stop
        self.pool: list[tuple[list[int], list[int]]] = []
        self.pool_texts: list[tuple[str, str]] = []
        if cfg.weak_skills and cfg.weak_pool > 0:
            weak = SyntheticTask(TaskConfig.model_validate({**base, "skills": cfg.weak_skills}))
            pool_rng = random.Random(f"sft-pool:{cfg.seed}")
            for p in weak.prompts("train", cfg.weak_pool, seed=cfg.seed + 7919):
                target = weak.sft_target(p, pool_rng)
                self.pool_texts.append((p.text, target))
                self.pool.append(self._encode(p, target))
        self._step = 0

    def _encode(self, prompt: Prompt, target: str) -> tuple[list[int], list[int]]:
        return (self.render.ids(prompt), completion_ids(self.tok, target, self.append_eos))

    def batch(self) -> list[tuple[list[int], list[int]]]:
        n = self.cfg.batch
        fresh: list[Prompt] = self.strong.prompts("train", n, seed=self.cfg.seed * 1_000_003
                                                  + self._step)
        self._step += 1
        out = []
        for p in fresh:
            if self.pool and self.rng.random() < self.cfg.weak_share:
                out.append(self.rng.choice(self.pool))
            else:
                out.append(self._encode(p, self.strong.sft_target(p, self.rng)))
        return out


def _save_atomic(model: PreTrainedModel, tok: PreTrainedTokenizerBase, out: Path,
                 extra: dict[str, Any]) -> None:
    """save_pretrained into a temporary sibling, then swap it in (readers never see half)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    for name, obj in extra.items():
        (tmp / name).write_text(json.dumps(obj, indent=2, default=str))
    if out.exists():
        shutil.rmtree(out)
    os.rename(tmp, out)


def run_sft(cfg: SFTConfig) -> Path:
    """Train, evaluate per skill on held-out problems, save; returns the checkpoint directory."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    src = ensure_preset(cfg.preset, cfg.cache_dir, cfg.seed) if cfg.preset else cfg.model_path
    if src is None:
        raise ValueError("sft needs `preset` or `model_path`")
    model, tok = load_policy(src, cfg.dtype, cfg.device)
    model.train()
    data = _Data(cfg, tok)
    eval_task = SyntheticTask(cfg.task)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / cfg.warmup) if cfg.warmup else 1.0)
    device = next(model.parameters()).device

    losses: list[float] = []
    curve: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    with _progress(cfg.progress, cfg.steps) as bar:
        for step in range(1, cfg.steps + 1):
            out = model(**pack_batch(tok, data.batch(), device))
            opt.zero_grad(set_to_none=True)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            sched.step()
            losses.append(float(out.loss.detach()))
            bar(step, losses[-1])
            if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:
                acc = evaluate(model, tok, eval_task, cfg.eval_every_per_skill, data.render)
                curve.append({"step": step, "seconds": round(time.perf_counter() - t0, 1),
                              **acc})
                model.train()
    train_s = time.perf_counter() - t0
    acc = evaluate(model, tok, eval_task, cfg.eval_per_skill, data.render)
    out_dir = cfg.resolved_out_dir()
    report = {
        "heldout_accuracy": acc,
        "strong_skills": cfg.strong_skills,
        "weak_skills": cfg.weak_skills,
        "weak_pool": [{"prompt": p, "target": t} for p, t in data.pool_texts],
        "steps": cfg.steps,
        "train_seconds": round(train_s, 1),
        "loss_first": round(losses[0], 4),
        "loss_last_50": round(sum(losses[-50:]) / len(losses[-50:]), 4),
        "curve": curve,
        "start": str(src),
    }
    _save_atomic(model, tok, out_dir, {EVAL_FILE: report,
                                       "sft_config.json": cfg.model_dump(mode="json")})
    return out_dir


class _progress:
    """A rich progress bar (or nothing) showing the step and the running loss."""

    def __init__(self, enabled: bool, total: int) -> None:
        self.enabled, self.total = enabled, total
        self._p: Any = None

    def __enter__(self) -> Any:
        if not self.enabled:
            # No terminal (a log file under `mutualrl up`): a plain line every 100 steps, which
            # `up` shows in its warm-start status.
            def line(step: int, loss: float) -> None:
                if step % 100 == 0 or step == self.total:
                    print(f"sft step {step}/{self.total} loss {loss:.4f}", flush=True)

            return line

        self._p = Progress(TextColumn("sft"), BarColumn(), TextColumn("{task.completed}/"
                           "{task.total}"), TextColumn("loss {task.fields[loss]:.4f}"),
                           TimeElapsedColumn())
        self._p.start()
        task = self._p.add_task("sft", total=self.total, loss=float("nan"))

        def update(step: int, loss: float) -> None:
            if step % 10 == 0 or step == self.total:
                self._p.update(task, completed=step, loss=loss)

        return update

    def __exit__(self, *exc: object) -> None:
        if self._p is not None:
            self._p.stop()
