"""Checkpoints hold a policy other tools load (save_pretrained + tokenizer), resume state that
loads with `torch.load(weights_only=True)`, and `mutualrl export` writes the policy out."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from mutualrl.cli import main
from mutualrl.trainer.runtime import checkpoint

TEXT = "12+34=46; 7*8=56."

# Run in a fresh interpreter that never imports MutualRL: what a user of the policy has.
_PLAIN_LOAD = r"""
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
path, text = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
ids = tok(text)["input_ids"]
with torch.no_grad():
    logits = model(torch.tensor([ids])).logits[0]
assert not any(m.startswith("mutualrl") for m in sys.modules), "imported mutualrl"
print(json.dumps({"ids": ids, "logits": logits.tolist()}))
"""


def plain_load(path: Path) -> tuple[list[int], torch.Tensor]:
    out = subprocess.run([sys.executable, "-c", _PLAIN_LOAD, str(path), TEXT],
                         capture_output=True, text=True, env={"OMP_NUM_THREADS": "1",
                                                              "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return data["ids"], torch.tensor(data["logits"], dtype=torch.float64)


def _own_logits(model, tok) -> tuple[list[int], torch.Tensor]:
    ids = tok(TEXT)["input_ids"]
    with torch.no_grad():
        return ids, model(torch.tensor([ids])).logits[0].double()


@pytest.fixture(scope="module")
def preset_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("presets")


def _cfg(out: Path, preset: str, probe: str = "none", rounds: int = 2):
    from mutualrl.trainer.config.run import TrainerConfig

    return TrainerConfig.model_validate({
        "run_id": "ck", "output_dir": str(out), "services": {"local": True},
        "grpo": {"group_size": 2, "prompts_per_round": 2, "rounds": rounds,
                 "max_new_tokens": 8},
        "probe": {"kind": probe},
        "eval": {"every": 0}, "checkpoint": {"every": 1, "keep": 2},
        "metrics": {"tensorboard": False, "progress": False},
        "policies": [{"name": "A", "preset": preset}]})


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, preset_cache: Path):
    """A llama-char policy after 2 local rounds (checkpoints after rounds 1 and 2)."""
    from mutualrl.trainer.runtime.loop import train
    from mutualrl.trainer.runtime.session import build_session

    out = tmp_path_factory.mktemp("run")
    s = build_session(_cfg(out, "llama-char"), "A", cache_dir=preset_cache)
    train(s)
    s.close()
    return s, out


def test_checkpoint_layout_and_plain_transformers_load(trained) -> None:
    s, out = trained
    ckpts = checkpoint.list_checkpoints(out / "ck" / "A" / "checkpoints")
    assert [p.name for p in ckpts] == ["round-000001", "round-000002"]
    last = ckpts[-1]
    assert sorted(p.name for p in last.iterdir()) == ["checkpoint.json", "policy", "resume.pt"]
    policy = last / "policy"
    assert (policy / "config.json").exists() and (policy / "tokenizer.json").exists()
    assert list(policy.glob("*.safetensors")) and not list(policy.glob("*.bin"))
    assert json.loads((last / "checkpoint.json").read_text()) == {
        "round": 2, "policy": "A", "layout": "full", "base": str(s.base_dir)}
    ids, logits = plain_load(policy)
    own_ids, own = _own_logits(s.model, s.tokenizer)
    assert ids == own_ids
    assert torch.allclose(logits, own, rtol=0, atol=1e-5), (logits - own).abs().max()


def test_resume_state_loads_with_weights_only(trained) -> None:
    _, out = trained
    state = torch.load(out / "ck/A/checkpoints/round-000002/resume.pt", weights_only=True)
    assert state["round"] == 2 and state["policy"] == "A"
    assert set(state) >= {"optimizer", "scheduler", "rng", "probe", "see_consumer"}
    assert state["optimizer"]["state"]  # AdamW moments: a step was taken
    assert "model" not in state  # the weights live in policy/ only


def test_rng_state_round_trips() -> None:
    import random

    import numpy as np

    saved = checkpoint.rng_state()
    want = (random.random(), torch.rand(3), np.random.rand())
    path = Path(tempfile.mkdtemp()) / "rng.pt"
    torch.save(saved, path)
    checkpoint.set_rng_state(torch.load(path, weights_only=True))
    got = (random.random(), torch.rand(3), np.random.rand())
    assert want[0] == got[0] and torch.equal(want[1], got[1]) and want[2] == got[2]


def test_check_plain_names_the_entry() -> None:
    class Opaque:
        pass

    checkpoint.check_plain({"a": [1, 2.0, "x", None, (torch.zeros(1), True)]})
    with pytest.raises(TypeError, match=r"state\['probe'\]\['pending'\]\[1\] is a Opaque"):
        checkpoint.check_plain({"probe": {"pending": [1, Opaque()]}})


def test_prp_pending_rollouts_survive_a_weights_only_round_trip(tmp_path: Path) -> None:
    from mutualrl.trainer.config.run import ProbeSettings
    from mutualrl.trainer.sharing.exchange import PeerRollout
    from mutualrl.trainer.sharing.probes.prp import PRPProbe

    probe = PRPProbe(ProbeSettings(kind="prp"), "A", None)
    probe.pending = [PeerRollout("1-0", "B", 3, "p7", "12", "r/B", [5, 6], [(0, 1), (1, 2)],
                                 [-0.5, -1.25], 1.0)]
    probe.fallbacks = 2
    torch.save(probe.state_dict(), tmp_path / "p.pt")
    again = PRPProbe(ProbeSettings(kind="prp"), "A", None)
    again.load_state_dict(torch.load(tmp_path / "p.pt", weights_only=True))
    assert again.pending == probe.pending and again.fallbacks == 2


def test_export_copies_the_policy_and_names_missing_parts(trained, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    s, out = trained
    run = out / "ck"
    dest = tmp_path / "exported"
    assert main(["export", "--run", str(run), "--policy", "A", "--round", "1",
                 "--out", str(dest)]) == 0
    assert json.loads(capsys.readouterr().out)["checkpoint"].endswith("round-000001")
    from safetensors.torch import load_file

    exported = load_file(str(dest / "model.safetensors"))
    kept = load_file(str(run / "A/checkpoints/round-000001/policy/model.safetensors"))
    assert exported.keys() == kept.keys()
    assert all(torch.equal(exported[k], kept[k]) for k in kept)
    # By run id under --output-dir, latest round: the final weights.
    latest = tmp_path / "latest"
    assert main(["export", "--run", "ck", "--output-dir", str(out), "--policy", "A",
                 "--out", str(latest)]) == 0
    _, logits = plain_load(latest)
    assert torch.allclose(logits, _own_logits(s.model, s.tokenizer)[1], rtol=0, atol=1e-5)
    capsys.readouterr()

    for argv, msg in [
        (["--run", str(tmp_path / "nope"), "--policy", "A"], "run '.*nope'"),
        (["--run", str(run), "--policy", "Z"], r"policy 'Z'.*\['A'\]"),
        (["--run", str(run), "--policy", "A", "--round", "7"], r"round 7.*\[1, 2\]"),
        (["--run", str(run), "--policy", "A"], "--out .*not empty"),
    ]:
        assert main(["export", *argv, "--out", str(dest)]) == 2
        err = capsys.readouterr().err
        assert re.search(msg, err), err


def test_an_old_pickled_checkpoint_is_refused_not_unpickled(tmp_path: Path) -> None:
    old = tmp_path / "round-000003"
    old.mkdir()
    torch.save({"model": {}}, old / "state.pt")
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    with pytest.raises(FileNotFoundError, match="older MutualRL"):
        checkpoint.load(old, model, opt, sched)
