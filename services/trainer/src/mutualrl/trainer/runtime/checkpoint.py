"""Checkpoints: everything needed for `--resume` to produce the same next round as an
uninterrupted run, in files other tools can read.

One checkpoint is a directory `round-<k>` (k = rounds completed) holding

- `policy/`: the policy as `save_pretrained` writes it (config, safetensors, tokenizer), which
  `transformers.AutoModelForCausalLM.from_pretrained` loads with no MutualRL code; or, for a
  LoRA policy, `adapter/`: the peft adapter (`adapter_config.json`, safetensors, tokenizer)
  over the base model named in the manifest (`mutualrl export` merges the two);
- `resume.pt`: optimizer, scheduler, every RNG, round, probe state and SEE position, as tensors
  and plain containers only, so it loads with `torch.load(weights_only=True)` (and is a state
  dict torch.distributed.checkpoint can write too);
- `checkpoint.json`: the manifest (round, policy, layout, base model directory).
"""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file
from torch.optim.lr_scheduler import LRScheduler
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from mutualrl.trainer.model.lora import is_lora

_NAME = re.compile(r"^round-(\d+)$")
POLICY_DIR = "policy"
ADAPTER_DIR = "adapter"
RESUME_FILE = "resume.pt"
MANIFEST = "checkpoint.json"


def rng_state() -> dict[str, Any]:
    """Every RNG the trainer draws from, as tensors and plain containers."""
    py_version, py_state, py_gauss = random.getstate()
    state: dict[str, Any] = {"python": [py_version, list(py_state), py_gauss],
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
        # numpy's key array would need an unpickling allow-list; a tensor loads plainly.
        state["numpy"] = [kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), int(pos),
                          int(has_gauss), float(gauss)]
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, py_state, gauss = state["python"]
    random.setstate((version, tuple(py_state), gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))


_PLAIN = (str, int, float, bool, type(None), torch.Tensor)


def check_plain(obj: object, where: str = "state") -> None:
    """Raise TypeError naming the entry of `obj` that is not a tensor or a plain container.

    `torch.load(weights_only=True)` refuses anything else; failing at save time names the
    culprit instead of leaving a checkpoint that cannot resume.
    """
    if isinstance(obj, _PLAIN):
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            if not isinstance(k, str | int):
                raise TypeError(f"{where}: key {k!r} is a {type(k).__name__}, not str or int")
            check_plain(v, f"{where}[{k!r}]")
        return
    if isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            check_plain(v, f"{where}[{i}]")
        return
    raise TypeError(f"{where} is a {type(obj).__name__}: resume state holds only tensors, "
                    "numbers, strings and lists/tuples/dicts of them")


def resume_state(round_k: int, optimizer: torch.optim.Optimizer, scheduler: LRScheduler,
                 extra: dict[str, Any]) -> dict[str, Any]:
    """The resume state of round `round_k`: optimizer, scheduler, RNGs and `extra`."""
    state = {"round": round_k, "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "rng": rng_state(), **extra}
    check_plain(state)
    return state


def save(
    ckpt_dir: Path,
    round_k: int,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    extra: dict[str, Any],
    keep: int = 2,
    base: Path | None = None,
) -> Path:
    """Write checkpoint `round-<k>` atomically (a temporary directory renamed into place);
    prune to the newest `keep`. `base` is the directory the policy started from (what a LoRA
    adapter applies to)."""
    state = resume_state(round_k, optimizer, scheduler, extra)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    final = ckpt_dir / f"round-{round_k:06d}"
    tmp = ckpt_dir / f".tmp-round-{round_k:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    lora = is_lora(model)
    weights = tmp / (ADAPTER_DIR if lora else POLICY_DIR)
    model.save_pretrained(weights)  # peft writes only the adapters
    tokenizer.save_pretrained(weights)
    torch.save(state, tmp / RESUME_FILE)
    manifest = {"round": round_k, "policy": extra.get("policy"),
                "layout": "lora" if lora else "full",
                "base": str(base) if base is not None else None}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(list_checkpoints(ckpt_dir))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(ckpt_dir: Path) -> list[Path]:
    if not ckpt_dir.exists():
        return []
    return sorted(p for p in ckpt_dir.iterdir() if _NAME.match(p.name))


def round_of(path: Path) -> int:
    """Rounds completed at checkpoint `path` (from its name `round-<k>`)."""
    m = _NAME.match(path.name)
    if m is None:
        raise ValueError(f"{path}: not a checkpoint directory (round-<k>)")
    return int(m.group(1))


def latest(ckpt_dir: Path) -> Path | None:
    found = list_checkpoints(ckpt_dir)
    return found[-1] if found else None


def manifest(path: Path) -> dict[str, Any]:
    """The manifest of checkpoint `path`."""
    data: dict[str, Any] = json.loads((path / MANIFEST).read_text())
    return data


def load_weights(model: torch.nn.Module, weights_dir: Path) -> None:
    """Copy every safetensors file of a `save_pretrained` directory into `model` in place.

    Tensors `save_pretrained` leaves out are the tied ones; each must share storage with a
    loaded tensor, anything else missing or unexpected is an error.
    """
    files = sorted(weights_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{weights_dir}: no *.safetensors file")
    own = model.state_dict()
    loaded: set[str] = set()
    for f in files:
        part = load_file(str(f))
        unexpected = sorted(set(part) - set(own))
        if unexpected:
            raise KeyError(f"{f}: tensors the model does not have: {unexpected[:5]}")
        model.load_state_dict(part, strict=False)
        loaded |= set(part)
    shared = {own[k].untyped_storage().data_ptr() for k in loaded}
    missing = [k for k in own if k not in loaded
               and own[k].untyped_storage().data_ptr() not in shared]
    if missing:
        raise KeyError(f"{weights_dir}: tensors missing from the checkpoint: {missing[:5]}")


def load(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
) -> dict[str, Any]:
    """Restore model (or its adapters) / optimizer / scheduler / RNGs in place; returns the
    resume state (round, probe state, SEE position, ...)."""
    if not (path / RESUME_FILE).exists():
        old = " (a pickled state.pt of an older MutualRL, which is never unpickled: " \
              "start afresh)" if (path / "state.pt").exists() else ""
        raise FileNotFoundError(f"{path}: no {RESUME_FILE}{old}")
    state: dict[str, Any] = torch.load(path / RESUME_FILE, map_location="cpu",
                                       weights_only=True)
    if is_lora(model):
        from peft import set_peft_model_state_dict

        adapter = path / ADAPTER_DIR
        if not adapter.is_dir():
            raise FileNotFoundError(f"{path}: no {ADAPTER_DIR}/ (a checkpoint of a non-LoRA "
                                    "policy cannot resume a LoRA one)")
        set_peft_model_state_dict(model, load_file(str(adapter / "adapter_model.safetensors")))
    else:
        weights = path / POLICY_DIR
        if not weights.is_dir():
            raise FileNotFoundError(f"{path}: no {POLICY_DIR}/ (a LoRA checkpoint cannot "
                                    "resume a policy without `lora`)")
        load_weights(model, weights)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return state
