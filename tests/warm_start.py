"""Warm-started tiny policies of different families and tokenizers, shared by the tests that
train several policies together: A (GPT-2, byte BPE without pre-split) is strong on `add`, B
(Llama, characters) on `rev`, C (Qwen2, Unigram) on `add`, so each fails a skill a peer has;
and the thread those tests train each policy's session in; and chat policies warm-started on a
table task, each on its own problems."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

TASK = {"skills": ["add", "rev"], "digits": {"add": 1, "rev": 2}, "heldout_per_skill": 8}
# A merges across digits (byte-level BPE, no pre-split), B is character level: their token
# boundaries differ, so PRP goes through real THL chunks.
WARM = {"A": ("gpt2-bpe-nosplit", "add"), "B": ("llama-char", "rev"),
        "C": ("qwen2-unigram", "add")}


def warm_checkpoints(request: pytest.FixtureRequest,
                     tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """SFT checkpoints, cached across test runs in pytest's cache (they take ~30 s each);
    bump the cache name when TASK, WARM or the SFT settings change."""
    from mutualrl.trainer.config.sft import SFTConfig
    from mutualrl.trainer.runtime.sft import run_sft

    pytest_cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    cache = (Path(pytest_cache.mkdir("mutualrl-trainer-e2e-v3")) if pytest_cache is not None
             else tmp_path_factory.mktemp("warm"))
    out: dict[str, Path] = {}
    for name, (preset, strong) in WARM.items():
        ckpt = cache / f"sft-{name}"
        if not (ckpt / "config.json").exists():
            run_sft(SFTConfig(
                preset=preset, task=TASK, strong_skills=[strong], steps=150, batch=32,
                warmup=20, lr=3e-3, weak_pool=0, weak_share=0.0, eval_per_skill=8,
                cache_dir=cache / "presets", out_dir=ckpt, progress=False))
        out[name] = ckpt
    return out


def warm_on_table(cache: Path, trainer: Any, known: Mapping[str, Sequence[str]],
                  max_steps: int = 300, lr: float = 2e-3) -> dict[str, Path]:
    """Each policy of `trainer` (a TrainerConfig over a table task) fine-tuned to answer the
    problems whose prompt column is in `known[name]` with their bare reference (what follows
    `####`), on the prompts the run gives it: the trainer's own DatasetTask (the task's system
    prompt) and the policy's own renderer (its chat template and template arguments). Full
    batch, until the loss is below 0.01 (or `max_steps`). Cached under `cache` by a digest of
    what the result depends on (~10-25 s a policy on one free core otherwise)."""
    import torch

    from mutualrl.trainer.data.answers import after_hashes
    from mutualrl.trainer.data.chat import renderer_for
    from mutualrl.trainer.data.dataset_task import DatasetTask
    from mutualrl.trainer.runtime.presets import load_policy
    from mutualrl.trainer.runtime.sft import completion_ids, pack_batch

    torch.set_num_threads(1)  # the cores are shared with the services and the other tests
    task = DatasetTask(trainer.task)
    out: dict[str, Path] = {}
    for policy in trainer.policies:
        model, tok = load_policy(policy.model_path, "float32", "cpu")
        render = renderer_for(tok, policy)
        mine = [p for p in task.problems if task.columns(p)[task.prompt_key] in known[policy.name]]
        assert len(mine) == len(known[policy.name]), (policy.name, known[policy.name])
        targets = [str(after_hashes(p.answer)) for p in mine]
        # Keyed by text, not by the start's bytes: a preset's Unigram tokenizer trains
        # differently from one build to the next, and the warm checkpoint carries its own.
        start = Path(policy.model_path)
        key = hashlib.sha256(json.dumps([
            policy.name, (start / "preset.json").read_text(), [render.text(p) for p in mine],
            targets, max_steps, lr]).encode()).hexdigest()[:16]
        ckpt = cache / f"{policy.name}-{key}"
        if not (ckpt / "config.json").exists():
            pairs = [(render.ids(p), completion_ids(tok, t, True))
                     for p, t in zip(mine, targets, strict=True)]
            torch.manual_seed(0)
            model.train()
            opt = torch.optim.AdamW(model.parameters(), lr=lr)
            # a short warm-up and clipping, as `mutualrl sft`: tiny models diverge without them
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
            t0, steps = time.monotonic(), 0
            while steps < max_steps:
                steps += 1
                loss = model(**pack_batch(tok, pairs, torch.device("cpu"))).loss
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                if float(loss.detach()) < 0.01:
                    break
            print(f"warm start {policy.name}: {steps} steps, loss {float(loss.detach()):.4f}, "
                  f"{time.monotonic() - t0:.0f} s")
            tmp = ckpt.with_name(f"{ckpt.name}.tmp")
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            tmp.rename(ckpt)
        out[policy.name] = ckpt
    return out


def start_training(session: Any, errors: list[BaseException]) -> threading.Thread:
    """Train `session` in a started thread; what it raises lands in `errors` (a thread cannot
    fail the test itself)."""
    from mutualrl.trainer.runtime.loop import train

    def work() -> None:
        try:
            train(session)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=work)
    t.start()
    return t
