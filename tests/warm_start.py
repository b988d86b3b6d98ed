"""Warm-started tiny policies of different families and tokenizers, shared by the tests that
train several policies together: A (GPT-2, byte BPE without pre-split) is strong on `add`, B
(Llama, characters) on `rev`, C (Qwen2, Unigram) on `add`, so each fails a skill a peer has;
and the thread those tests train each policy's session in."""

from __future__ import annotations

import threading
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
