"""Tiny instruct-style policies for tests: a preset's model with a chat template written into
its tokenizer_config.json (as a real instruct checkpoint ships it), and a small parquet table
of arithmetic problems under non-default column names."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

# ChatML, the form Qwen's instruct checkpoints use.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Llama-3's form: BOS from the template, header ids around each role.
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
    "<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
TEMPLATES = {"gpt2-bpe": CHATML, "llama-char": LLAMA3}


def chat_policy(preset: str, cache: Path, out: Path, template: str | None = None) -> Path:
    """A copy of `preset` at `out` whose tokenizer_config.json carries `template` (default the
    preset's in TEMPLATES)."""
    from mutualrl.trainer.runtime.presets import ensure_preset

    if not (out / "config.json").exists():
        shutil.copytree(ensure_preset(preset, cache), out, dirs_exist_ok=True)
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = template or TEMPLATES[preset]
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return out


def write_problems(path: Path, n: int, start: int = 1) -> Path:
    """`n` one-digit additions in parquet: columns `query` (text), `gold` (the answer) and
    `kind` (the skill: `small` or `large` sums)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [(a, b) for a in range(start, 10) for b in range(0, 10)][:n]
    table = pa.table({
        "query": [f"add:{a}+{b}=" for a, b in rows],
        "gold": [str(a + b) for a, b in rows],
        "kind": ["small" if a + b < 10 else "large" for a, b in rows],
    })
    pq.write_table(table, path)
    return path
