"""`mutualrl export`: a trained policy as a plain `save_pretrained` directory.

The directory (config, safetensors, tokenizer) loads with `AutoModelForCausalLM` /
`AutoTokenizer.from_pretrained` alone, and SGLang or vLLM serve it. A LoRA checkpoint's adapters
are merged into their base weights first.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from transformers import AutoModelForCausalLM

from mutualrl.thl.tokenizers import load_tokenizer
from mutualrl.trainer.runtime import checkpoint


class ExportError(ValueError):
    """A run, policy or round that does not exist, or an output that is in the way."""


def find_checkpoint(run: str | Path, policy: str, round_k: int | None = None,
                    output_dir: Path = Path("runs")) -> Path:
    """Checkpoint directory of `policy` in `run` after `round_k` rounds (default: the latest).

    `run` is a run directory (`<output_dir>/<run_id>`) or a run id under `output_dir`.
    """
    run_dir = Path(run)
    if not run_dir.is_dir():
        run_dir = output_dir / str(run)
    if not run_dir.is_dir():
        raise ExportError(f"run {str(run)!r}: no directory {run} or {output_dir / str(run)}")
    policies = sorted(p.name for p in run_dir.iterdir() if (p / "checkpoints").is_dir())
    if policy not in policies:
        raise ExportError(f"policy {policy!r}: no checkpoints in {run_dir / policy}; policies "
                          f"with checkpoints in this run: {policies or 'none'}")
    found = checkpoint.list_checkpoints(run_dir / policy / "checkpoints")
    rounds = [checkpoint.round_of(p) for p in found]
    if not found:
        raise ExportError(f"policy {policy!r}: {run_dir / policy / 'checkpoints'} holds no "
                          "checkpoint")
    if round_k is None:
        return found[-1]
    if round_k not in rounds:
        raise ExportError(f"round {round_k}: no checkpoint of policy {policy!r} after that "
                          f"round; kept rounds: {rounds}")
    return found[rounds.index(round_k)]


def export(ckpt: Path, out: Path, overwrite: bool = False) -> Path:
    """Write checkpoint `ckpt`'s policy to `out` as a `save_pretrained` directory."""
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ExportError(f"--out {out}: exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)
    full = ckpt / checkpoint.POLICY_DIR
    if full.is_dir():
        shutil.copytree(full, out, dirs_exist_ok=True)
        return out
    adapter = ckpt / checkpoint.ADAPTER_DIR
    if not adapter.is_dir():
        raise ExportError(f"{ckpt}: neither {checkpoint.POLICY_DIR}/ nor "
                          f"{checkpoint.ADAPTER_DIR}/ (not a checkpoint of this version)")
    base = checkpoint.manifest(ckpt).get("base")
    if not base or not Path(base, "config.json").exists():
        raise ExportError(f"{ckpt}: the LoRA adapter's base model {base!r} is gone; it must "
                          "exist to merge the adapter into it")
    merge_adapter(Path(base), adapter, out)
    return out


def merge_adapter(base: Path, adapter: Path, out: Path) -> None:
    """base + adapter (peft), merged into plain weights, saved with the adapter's tokenizer."""
    from peft import PeftModel

    model = AutoModelForCausalLM.from_pretrained(base, dtype="auto")
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    merged.save_pretrained(out)
    load_tokenizer(adapter).save_pretrained(out)
