"""A user's run file that cannot train stops `mutualrl up` before anything starts, with exit 2
and a message that names the field, brackets and all (a rich console takes `policies[a]` for
markup unless told otherwise): a reward file that is not there, a table that is not there, a
column the table lacks, a chat template with a syntax error (named by its file), and a prompt
that with its completion budget does not fit the model's context (both lengths named). No
service starts, and no status table follows the error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from chat_policies import chat_policy, write_problems

pytestmark = [pytest.mark.slow, pytest.mark.timeout(360)]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """configs/gsm8k-chat-cpu.yaml with its policies and tables made (one set for every case)."""
    root = tmp_path_factory.mktemp("bad-input")
    cfg = yaml.safe_load((ROOT / "configs/gsm8k-chat-cpu.yaml").read_text())
    tr = cfg["trainer"]
    tr["output_dir"] = str(root / "runs")
    tr["task"]["dataset"]["path"] = str(write_problems(root / "train.parquet", 40))
    tr["eval"]["benchmarks"][0]["path"] = str(write_problems(root / "test.parquet", 6, start=6))
    tr["task"]["rewards"][1]["fn"] = str(ROOT / tr["task"]["rewards"][1]["fn"])
    presets = root / "runs" / "presets"
    for policy, preset in zip(tr["policies"], ("gpt2-bpe", "llama-char"), strict=True):
        policy["model_path"] = str(chat_policy(preset, presets, root / policy["name"]))
    return root, cfg


def _up(root: Path, cfg: dict[str, Any], name: str) -> subprocess.CompletedProcess[str]:
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    return subprocess.run([sys.executable, "-m", "mutualrl.cli", "up", "-c", str(path)],
                          capture_output=True, text=True, env=env, timeout=300, cwd=root)


def _case(name: str, cfg: dict[str, Any], root: Path) -> tuple[list[str], dict[str, Any]]:
    """The names the error must print, and the broken config."""
    cfg = json.loads(json.dumps(cfg))
    tr = cfg["trainer"]
    tr["run_id"] = f"bad-{name}"
    if name == "reward-file":
        tr["task"]["rewards"][1]["fn"] = str(root / "no_such_rewards.py") + ":concise"
        return ["task.rewards[concise].fn", "no_such_rewards.py"], cfg
    if name == "dataset":
        tr["task"]["dataset"]["path"] = str(root / "missing.parquet")
        return ["task.dataset.path", "missing.parquet", "does not exist"], cfg
    if name == "column":
        tr["task"]["dataset"]["prompt_key"] = "question"
        return ["task.dataset.prompt_key", "'question'", "query"], cfg
    if name == "template":
        broken = root / "broken-template"
        chat_policy("gpt2-bpe", root / "runs" / "presets", broken,
                    template="{% for m in messages %}{{ m['content'] }}")  # no endfor
        tr["policies"][0]["model_path"] = str(broken)
        return ["policies[gpt2-chatml]", str(broken / "tokenizer_config.json"),
                "TemplateSyntaxError"], cfg
    if name == "context":
        # GPT-2's preset has n_positions 128; the system prompt alone renders past it.
        tr["task"]["system"] = "Answer with the sum. " * 30
        tr["policies"][0].pop("max_prompt_tokens")
        tr["policies"][1].pop("max_prompt_tokens")
        return ["policies[gpt2-chatml]", "task.max_new_tokens 6", "context of 128 tokens",
                "n_positions in"], cfg
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["reward-file", "dataset", "column", "template", "context"])
def test_a_bad_input_exits_2_before_anything_starts(base: tuple[Path, dict[str, Any]],
                                                    name: str) -> None:
    root, cfg = base
    names, broken = _case(name, cfg, root)
    proc = _up(root, broken, name)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    for text in names:
        assert text in out.replace("\n", ""), (text, out[-3000:])
    assert "dashboard" not in out and "mutualrl up - run" not in out, out[-3000:]
    assert not (root / "runs" / f"bad-{name}" / "logs").exists()  # nothing was started


def test_the_run_file_as_shipped_fits(base: tuple[Path, dict[str, Any]]) -> None:
    """The same check passes the shipped config and says what it measured: each policy's own
    rendering (its chat template's markup included) against its own model's context."""
    _, cfg = base
    from mutualrl.thl.tokenizers import load_tokenizer
    from mutualrl.trainer.config.run import TrainerConfig
    from mutualrl.trainer.data.chat import renderer_for
    from mutualrl.trainer.runtime.preflight import check_inputs

    tr = TrainerConfig.model_validate(cfg["trainer"])
    budgets = {b.policy: b for b in check_inputs(tr)}
    gpt2, llama = budgets["gpt2-chatml"], budgets["llama-llama3"]
    assert (gpt2.context, llama.context) == (128, 256)
    assert gpt2.max_new_tokens == llama.max_new_tokens == 6
    for budget in (gpt2, llama):
        policy = tr.policy(budget.policy)
        assert policy.model_path is not None
        renderer = renderer_for(load_tokenizer(policy.model_path), policy)
        prompt = next(p for p in renderer_problems(tr) if p.id == budget.prompt_id)
        assert len(renderer.ids(prompt)) == budget.prompt_tokens <= budget.context - 6
        assert budget.problems == 40 + 6  # the table and the benchmark, every problem


def renderer_problems(tr: Any) -> list[Any]:
    from mutualrl.trainer.data.dataset_task import DatasetTask
    from mutualrl.trainer.data.evaluation import benchmark_task

    task = DatasetTask(tr.task)
    return list(task.problems) + list(benchmark_task(tr.eval.benchmarks[0], task).problems)
