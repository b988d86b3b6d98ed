"""Checkpoints: everything needed for `--resume` to produce the same next round as an
uninterrupted run (model, optimizer, scheduler, every RNG, round, probe state, SEE position)."""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path
from typing import Any

import torch

_NAME = re.compile(r"^round-(\d+)$")


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])


def save(
    ckpt_dir: Path,
    round_k: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    extra: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write checkpoint `round-<k>` (k = rounds completed) atomically; prune to `keep`."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"round-{round_k:06d}"
    tmp = ckpt_dir / f".tmp-round-{round_k:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    torch.save(
        {
            "round": round_k,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": rng_state(),
            **extra,
        },
        tmp / "state.pt",
    )
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(list_checkpoints(ckpt_dir))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(ckpt_dir: Path) -> list[Path]:
    if not ckpt_dir.exists():
        return []
    return sorted(p for p in ckpt_dir.iterdir() if _NAME.match(p.name))


def latest(ckpt_dir: Path) -> Path | None:
    found = list_checkpoints(ckpt_dir)
    return found[-1] if found else None


def load(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
) -> dict[str, Any]:
    """Restore model / optimizer / scheduler / RNGs in place; returns the whole state dict
    (round, probe state, SEE position, ...)."""
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return state
