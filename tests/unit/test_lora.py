"""LoRA through peft: only adapters train and are checkpointed, the reference is the base with
the adapters disabled (no second model), every probe's loss works, SGLang gets merged weights,
and export merges the adapters."""

from __future__ import annotations

import copy
import gc
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_round import PAD, fixed_round, tiny_model

from mutualrl.trainer.algos.xgrpo import RewardStats, xgrpo_advantages
from mutualrl.trainer.config.run import GRPOSettings, LoraSettings, ProbeSettings
from mutualrl.trainer.model import lora
from mutualrl.trainer.model.batch import completion_logprobs, pack
from mutualrl.trainer.runtime import checkpoint
from mutualrl.trainer.runtime.step import StepSettings, optimise
from mutualrl.trainer.sharing.probes import Demos, PeerRows, make_probe

torch.set_num_threads(1)
TEXT = "12+34=46; 7*8=56."


# A fresh interpreter that never imports MutualRL: what a user of the exported policy has.
_PLAIN_LOAD = r"""
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
with torch.no_grad():
    logits = model(torch.tensor([tok(sys.argv[2])["input_ids"]])).logits[0]
assert not any(m.startswith("mutualrl") for m in sys.modules), "imported mutualrl"
print(json.dumps(logits.tolist()))
"""


def plain_logits(path: Path) -> torch.Tensor:
    out = subprocess.run([sys.executable, "-c", _PLAIN_LOAD, str(path), TEXT],
                         capture_output=True, text=True,
                         env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    return torch.tensor(json.loads(out.stdout.strip().splitlines()[-1]), dtype=torch.float64)
LORA = LoraSettings(rank=4, alpha=8, target_modules=["q_proj", "v_proj", "up_proj"])


def _perturb_adapters(model, seed: int = 1) -> None:
    """Give every B a non-zero value (peft initialises B = 0: the adapters would be no-ops)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)


def _own_batch():
    prompt_ids, data = fixed_round()
    return pack([prompt_ids[i // 4] for i in range(8)],
                [s.token_ids for row in data.samples for s in row], PAD)


def test_only_adapters_train_and_the_reference_is_the_base() -> None:
    base = tiny_model()
    frozen = copy.deepcopy(base)
    model = lora.wrap(base, LORA)
    _perturb_adapters(model)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    ref = lora.BaseReference(model)
    assert list(ref.parameters()) == [] and ref.policy is model
    assert ref.config is model.config  # attributes read through
    batch = _own_batch()
    model.train()
    for chunk in (None, 5):  # the full forward and the chunked LM-head path
        with torch.no_grad():
            want = completion_logprobs(frozen, batch, 1.0, chunk)
            got = completion_logprobs(ref, batch, 1.0, chunk)
            adapted = completion_logprobs(model, batch, 1.0, chunk)
        assert torch.equal(got, want), chunk
        assert not torch.allclose(adapted, want)  # the adapters do act when enabled
    assert model.training  # the reference put the mode back


@pytest.mark.parametrize("kind", ["none", "xgrpo", "prp", "sgt"])
def test_every_probe_steps_only_the_adapters(kind: str) -> None:
    model = lora.wrap(tiny_model(), LORA)
    _perturb_adapters(model)
    ref = lora.BaseReference(model)
    prompt_ids, data = fixed_round()
    plan = make_probe(ProbeSettings(kind=kind), "A", None).plan(data)
    if kind == "xgrpo":
        plan.advantages = xgrpo_advantages(
            data.rewards, [RewardStats.of([1.0, 1.0, 0.0]), RewardStats.of([0.0, 1.0])])
    if kind == "prp":
        row = data.samples[1][1].token_ids
        plan.peers = PeerRows(prompt_index=[1], token_ids=[row],
                              advantages=torch.tensor([0.7]),
                              sender_logp_sum=torch.tensor([-3.0]))
    if kind == "sgt":
        data.rewards = torch.zeros(2, 4)
        plan = make_probe(ProbeSettings(kind=kind), "A", None).plan(data)
        plan.demos = Demos(prompt_index=[1], token_ids=[[16, 18, 21, 2]])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    # The training path: micro-batches, a chunked LM head, two mini-batches.
    grpo = GRPOSettings(beta=0.1, micro_batch_tokens=24, logit_chunk_tokens=5, mini_batches=2,
                        lr=1e-2)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=grpo.lr)
    out = optimise(model, ref, opt, prompt_ids, data, plan,
                   StepSettings.of(grpo, ProbeSettings(kind=kind), PAD, 8))
    assert out.stats["kl"] > 0  # the adapted policy differs from its base reference
    if kind == "prp":
        assert out.stats["prp_w_mean"] > 0
    if kind == "sgt":
        assert out.stats["loss_sgt"] != 0
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".lora_" in n for n in changed), sorted(changed)[:3]


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_merged_tensors_are_base_plus_scaled_BA(family: str) -> None:
    if family == "llama":
        base, settings = tiny_model(), LORA
    else:
        from transformers import GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        base = GPT2LMHeadModel(GPT2Config(vocab_size=24, n_embd=32, n_layer=2, n_head=4,
                                          n_positions=64))
        settings = LoraSettings(rank=4, alpha=8, target_modules=["c_attn"])
    names = [n for n, _ in base.named_parameters()]
    frozen = {n: p.detach().clone() for n, p in base.named_parameters()}
    model = lora.wrap(base, settings)
    _perturb_adapters(model)
    merged = dict(lora.merged_named_tensors(model))
    assert list(merged) == names  # the base model's own names, none of peft's
    scale = settings.alpha / settings.rank
    adapted = 0
    for name, m in model.get_base_model().named_modules():
        if not hasattr(m, "lora_A"):
            continue
        a, b = m.lora_A["default"].weight, m.lora_B["default"].weight
        delta = scale * (b @ a)  # [out, in]
        if family == "gpt2":  # Conv1D stores [in, out]
            delta = delta.T
        assert torch.allclose(merged[f"{name}.weight"], frozen[f"{name}.weight"] + delta,
                              rtol=0, atol=1e-6)
        assert not torch.allclose(merged[f"{name}.weight"], frozen[f"{name}.weight"])
        adapted += 1
    assert adapted == (6 if family == "llama" else 2)
    untouched = [n for n in names if not any(t in n for t in ("q_proj", "v_proj", "up_proj",
                                                               "c_attn"))]
    assert all(torch.equal(merged[n], frozen[n]) for n in untouched)
    # The same as peft's own merge, and the trained module is left as it was.
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    assert all(torch.allclose(merged[n], reference[n], rtol=0, atol=1e-6) for n in merged)
    assert any(".lora_B." in n for n, _ in model.named_parameters())

    from mutualrl.trainer.model.lora import sync_tensors

    synced = dict(sync_tensors(model))
    assert all(torch.equal(synced[n], merged[n]) for n in merged)


@pytest.fixture(scope="module")
def preset_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("presets")


def _cfg(out: Path, lora_on: bool = True, beta: float = 0.05, rounds: int = 2):
    from mutualrl.trainer.config.run import TrainerConfig

    policy: dict = {"name": "A", "preset": "llama-char"}
    if lora_on:
        policy["lora"] = {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    return TrainerConfig.model_validate({
        "run_id": "lo", "output_dir": str(out), "services": {"local": True}, "seed": 3,
        "grpo": {"group_size": 4, "prompts_per_round": 4, "rounds": rounds,
                 "max_new_tokens": 12, "beta": beta, "lr": 1e-2},
        "task": {"format_reward": 0.5},
        "eval": {"every": 0}, "checkpoint": {"every": 1, "keep": 3},
        "metrics": {"tensorboard": False, "progress": False},
        "policies": [policy]})


def _count_models() -> int:
    """Causal LMs alive (their bodies, also PreTrainedModels, are not counted)."""
    from transformers import GenerationMixin, PreTrainedModel

    gc.collect()
    return sum(isinstance(o, PreTrainedModel) and isinstance(o, GenerationMixin)
               for o in gc.get_objects())


def test_session_loads_no_second_model_for_the_reference(tmp_path: Path, preset_cache) -> None:
    from mutualrl.trainer.runtime.presets import ensure_preset
    from mutualrl.trainer.runtime.session import build_session

    ensure_preset("llama-char", preset_cache, 3)  # building it makes a model of its own
    n0 = _count_models()
    s = build_session(_cfg(tmp_path / "a"), "A", cache_dir=preset_cache)
    assert _count_models() - n0 == 1
    assert isinstance(s.ref_model, lora.BaseReference) and s.ref_model.policy is s.model
    opt_params = [p for g in s.optimizer.param_groups for p in g["params"]]
    assert {id(p) for p in opt_params} == {
        id(p) for n, p in s.model.named_parameters() if ".lora_" in n}
    s.close()
    del s
    # Without LoRA the KL needs a frozen copy: the count above can fail.
    n0 = _count_models()
    full = build_session(_cfg(tmp_path / "b", lora_on=False), "A", cache_dir=preset_cache)
    assert _count_models() - n0 == 2
    full.close()


def test_lora_checkpoints_resume_and_export_merged(tmp_path: Path, preset_cache) -> None:
    from mutualrl.cli import main
    from mutualrl.trainer.runtime.loop import train
    from mutualrl.trainer.runtime.session import build_session

    straight = build_session(_cfg(tmp_path / "a"), "A", cache_dir=preset_cache)
    train(straight)
    straight.close()
    ckpt = tmp_path / "a/lo/A/checkpoints/round-000002"
    assert sorted(p.name for p in ckpt.iterdir()) == ["adapter", "checkpoint.json", "resume.pt"]
    assert (ckpt / "adapter/adapter_config.json").exists()
    assert json.loads((ckpt / "checkpoint.json").read_text())["layout"] == "lora"
    from safetensors.torch import load_file

    saved = load_file(str(ckpt / "adapter/adapter_model.safetensors"))
    assert saved and all("lora_" in k for k in saved)  # only the adapters are checkpointed

    first = build_session(_cfg(tmp_path / "b"), "A", cache_dir=preset_cache)
    train(first, rounds=1)
    first.close()
    resumed = build_session(_cfg(tmp_path / "b"), "A", resume=True, cache_dir=preset_cache)
    assert resumed.start_round == 1
    train(resumed)
    resumed.close()
    for (name, a), b in zip(straight.model.named_parameters(), resumed.model.parameters(),
                            strict=True):
        assert torch.equal(a, b), name
    moved = [n for n, p in straight.model.named_parameters() if "lora_B" in n and p.abs().sum()]
    assert moved  # training moved the adapters (B starts at zero)

    out = tmp_path / "merged"
    assert main(["export", "--run", str(tmp_path / "a/lo"), "--policy", "A", "--out",
                 str(out)]) == 0
    assert not (out / "adapter_config.json").exists()
    logits = plain_logits(out)
    straight.model.eval()
    with torch.no_grad():
        ids = straight.tokenizer(TEXT)["input_ids"]
        own = straight.model(input_ids=torch.tensor([ids])).logits[0].double()
    assert torch.allclose(logits, own, rtol=0, atol=1e-5), (logits - own).abs().max()
    assert checkpoint.round_of(ckpt) == 2


def test_activation_checkpointing_through_the_adapters_gives_the_same_step() -> None:
    """Frozen embeddings feed the checkpointed layers: the non-reentrant checkpoint the
    session enables must still carry gradients to the adapters, equal to the plain pass."""
    prompt_ids, data = fixed_round()
    after = []
    for ckpt in (False, True):
        model = lora.wrap(tiny_model(), LORA)
        _perturb_adapters(model)
        if ckpt:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        plan = make_probe(ProbeSettings(kind="none"), "A", None).plan(data)
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
        optimise(model, None, opt, prompt_ids, data, plan,
                 StepSettings.of(GRPOSettings(), ProbeSettings(), PAD, 8))
        after.append({n: p.detach().clone() for n, p in model.named_parameters()
                      if ".lora_" in n})
    assert after[0].keys() == after[1].keys()
    for n in after[0]:
        assert torch.allclose(after[0][n], after[1][n], rtol=0, atol=1e-6), n
    fresh = lora.wrap(tiny_model(), LORA)
    _perturb_adapters(fresh)
    assert any(not torch.equal(p, after[1][n]) for n, p in fresh.named_parameters()
               if ".lora_" in n)  # the step moved them
