"""Checkpoints of a data-parallel policy, through torch.distributed.checkpoint (DCP).

A checkpoint `round-<k>` of N ranks holds

- `dcp/`: model and optimizer state as DCP writes them (each rank its shards, keyed by
  parameter name), so any number of ranks reads it back: DCP reshards on load, and one
  process without a process group reads it too (`--resume` with a different N);
- `policy/`: the whole policy as `save_pretrained` writes it (rank 0 gathers it), which
  transformers loads with no MutualRL code (`mutualrl export` reads it as any checkpoint's);
- `resume.pt`: scheduler, RNGs, round, probe state and SEE position (rank 0's), plain data
  that loads with `torch.load(weights_only=True)`; the optimizer is in `dcp/`;
- `checkpoint.json`: the manifest (`"dcp": true` and the number of ranks that wrote it).

A one-process checkpoint (`checkpoint.py`) resumes on N ranks through `plain_to_sharded`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler
from transformers import PreTrainedTokenizerBase

from mutualrl.trainer.runtime import checkpoint
from mutualrl.trainer.runtime.distributed import SINGLE, Dist, full_state_dict

DCP_DIR = "dcp"


def is_dcp(path: Path) -> bool:
    """Whether checkpoint `path` was written by data-parallel ranks."""
    return (path / DCP_DIR).is_dir()


def save(
    ckpt_dir: Path, round_k: int, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase,
    optimizer: torch.optim.Optimizer, scheduler: LRScheduler, extra: dict[str, Any], keep: int,
    dist: Dist = SINGLE, base: Path | None = None,
) -> Path:
    """Write `round-<k>` from every rank (collective); rank 0 renames it into place and prunes
    to the newest `keep`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    final = ckpt_dir / f"round-{round_k:06d}"
    tmp = ckpt_dir / f".tmp-round-{round_k:06d}"
    if dist.main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    msd, osd = get_state_dict(model, optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp / DCP_DIR))
    full = full_state_dict(model)
    if dist.main:
        _save_pretrained(model, tokenizer, full, tmp / checkpoint.POLICY_DIR)
        state = {"round": round_k, "world": dist.world, "scheduler": scheduler.state_dict(),
                 "rng": checkpoint.rng_state(), **extra}
        checkpoint.check_plain(state)
        torch.save(state, tmp / checkpoint.RESUME_FILE)
        (tmp / checkpoint.MANIFEST).write_text(json.dumps(
            {"round": round_k, "policy": extra.get("policy"), "layout": "full",
             "base": str(base) if base is not None else None, "dcp": True,
             "world": dist.world}, indent=2))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in checkpoint.list_checkpoints(ckpt_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def _save_pretrained(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase,
                     state: dict[str, Any],
                     out: Path) -> None:
    """The gathered weights as a plain `save_pretrained` directory (the model object itself is
    sharded, so its own tensors are not written). A tied tensor (the LM head sharing the
    embeddings) is written once, under its first name, as `save_pretrained` does."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    tied = {n for group in names.values() for n in group[1:]}
    state = {k: v for k, v in state.items() if k not in tied}
    model.save_pretrained(out, state_dict=state)  # type: ignore[operator]
    tokenizer.save_pretrained(out)


def load(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         scheduler: LRScheduler) -> dict[str, Any]:
    """Restore a DCP checkpoint into this process's (sharded or plain) model and optimizer,
    whatever N wrote it; returns the resume state (round, probe, SEE position, ...)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    msd, osd = get_state_dict(model, optimizer)  # also creates AdamW's state to load into
    dcp.load({"model": msd, "optim": osd}, checkpoint_id=str(path / DCP_DIR))  # in place
    set_state_dict(model, optimizer, model_state_dict=msd, optim_state_dict=osd)
    state: dict[str, Any] = torch.load(path / checkpoint.RESUME_FILE, map_location="cpu",
                                       weights_only=True)
    scheduler.load_state_dict(state["scheduler"])
    checkpoint.set_rng_state(state["rng"])
    return state


def plain_optimizer_state(
    path: Path, model: torch.nn.Module,
    make_optimizer: Callable[[torch.nn.Module], torch.optim.Optimizer],
    make_scheduler: Callable[[torch.optim.Optimizer], LRScheduler],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load a one-process checkpoint into the still unsharded `model`; returns (the optimizer
    state keyed by parameter name, the resume state) for `load_full_optimizer` after
    sharding."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
    )

    opt = make_optimizer(model)
    state = checkpoint.load(path, model, opt, make_scheduler(opt))
    named = get_optimizer_state_dict(model, opt,
                                     options=StateDictOptions(full_state_dict=True))
    return named, state


def load_full_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        named: dict[str, Any]) -> None:
    """Shard a whole optimizer state (keyed by parameter name) into this rank's optimizer."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    set_optimizer_state_dict(model, optimizer, named,
                             options=StateDictOptions(full_state_dict=True))
