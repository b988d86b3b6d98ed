"""SFT warm start: loss goes down, checkpoint reloads through load_policy, eval json written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mutualrl.trainer.config.sft import SFTConfig
from mutualrl.trainer.config.task import TaskConfig
from mutualrl.trainer.runtime.presets import load_policy
from mutualrl.trainer.runtime.sft import EVAL_FILE, _Data, run_sft

torch.set_num_threads(1)


@pytest.mark.slow
def test_few_steps_lower_loss_and_save(tmp_path: Path) -> None:
    cfg = SFTConfig(preset="llama-char", cache_dir=tmp_path / "presets", steps=30, warmup=5,
                    batch=16, lr=3e-3, eval_per_skill=5, out_dir=tmp_path / "ckpt",
                    strong_skills=["sub", "sort"], progress=False)
    out = run_sft(cfg)
    report = json.loads((out / EVAL_FILE).read_text())
    assert report["loss_last_50"] < report["loss_first"] - 0.5
    acc = report["heldout_accuracy"]
    assert set(acc) == {"add", "sub", "rev", "sort", "mean"}
    assert all(0.0 <= v <= 1.0 for v in acc.values())
    assert report["weak_skills"] == ["add", "rev"] and len(report["weak_pool"]) == 4
    model, tok = load_policy(out)
    assert type(model).__name__ == "LlamaForCausalLM" and tok.is_fast
    assert json.loads((out / "sft_config.json").read_text())["steps"] == 30
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left


def test_data_mix_and_pool(tmp_path: Path) -> None:
    from mutualrl.trainer.runtime.presets import ensure_preset

    _, tok = load_policy(ensure_preset("llama-char", tmp_path))
    cfg = SFTConfig(preset="llama-char", task=TaskConfig(regime="worked"),
                    strong_skills=["add", "rev"], weak_pool=4, weak_share=0.25, batch=200)
    data = _Data(cfg, tok)
    assert [p for p, _ in data.pool_texts] and all(
        p.split(":")[0] in ("sub", "sort") for p, _ in data.pool_texts)
    batch = data.batch()
    pool = set(map(str, data.pool))
    from_pool = sum(str(x) in pool for x in batch)
    assert 25 <= from_pool <= 80  # ~25% of 200
    decoded = [tok.decode(p) for p, _ in batch if str((p, _)) not in pool]
    assert all(d.split(":")[0] in ("add", "rev") for d in decoded)
    # Completions are tokenized on their own and end with the end marker (no EOS needed).
    assert all(tok.decode(c).endswith(";") for _, c in batch)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        SFTConfig(preset=None)
    with pytest.raises(ValueError, match="not task skills"):
        SFTConfig(strong_skills=["mul"])
    with pytest.raises(ValueError):
        SFTConfig(stepz=3)  # unknown keys are errors
    assert SFTConfig().weak_skills == ["sub", "sort"]
    assert SFTConfig().resolved_out_dir() == Path("runs/sft/gpt2-bpe-short-s0")


def test_warm_start_prompts_render_as_the_policys_rl_prompts(tmp_path: Path) -> None:
    """SFT renders through the policy's chat template, and `mutualrl up` hands a warm start
    the policy's rendering settings."""
    import yaml
    from chat_policies import chat_policy

    from mutualrl.launch.up import make_launch_plan
    from mutualrl.trainer.data.chat import PromptRenderer

    model_dir = chat_policy("llama-char", tmp_path / "presets", tmp_path / "llama")
    _, tok = load_policy(model_dir)
    kwargs = {"date_string": "01 Jan 2025"}
    cfg = SFTConfig(model_path=model_dir, preset=None, strong_skills=["add"], weak_pool=0,
                    batch=8, chat_template_kwargs=kwargs)
    data = _Data(cfg, tok)
    rl = PromptRenderer(tok, "llama", template_kwargs=kwargs)
    assert rl.chat
    header = rl.ids(data.strong.prompts("train", 1, seed=0)[0])[:6]  # BOS + the user header
    assert header[0] == tok.bos_token_id
    assert all(ids[:6] == header for ids, _ in data.batch())
    prompt = data.strong.prompts("train", 1, seed=3)[0]
    assert data.render.ids(prompt) == rl.ids(prompt) != list(tok(prompt.text)["input_ids"])

    run = {"trainer": {"run_id": "w", "output_dir": str(tmp_path / "runs"),
                       "policies": [{"name": "a", "model_path": str(model_dir),
                                     "chat_template_kwargs": kwargs}]},
           "up": {"warm_start": {"a": {"model_path": str(model_dir), "preset": None}}}}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(run))
    plan, _ = make_launch_plan(path, "redis://127.0.0.1:6379/0", None)
    sft_yaml = tmp_path / "runs" / "w" / "warm_start" / "a.yaml"
    assert yaml.safe_load(sft_yaml.read_text())["sft"]["chat_template_kwargs"] == kwargs
    assert [s.name for s in plan.warm_start] == ["sft-a"]
