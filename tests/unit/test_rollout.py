"""HFEngine: behaviour log-probs, offsets, stop/length handling, seeding; engine factory."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch
from sample_checks import assert_text_and_offsets

from mutualrl.trainer.engines.base import Sample, completion_offsets
from mutualrl.trainer.engines.factory import make_engine
from mutualrl.trainer.engines.hf import HFEngine, _inverse_cdf, _truncate
from mutualrl.trainer.engines.sglang import sglang_sampling_params
from mutualrl.trainer.runtime.presets import ensure_preset, load_policy

torch.set_num_threads(1)

# Different lengths on purpose: left padding and position ids must not change the results.
PROMPTS = ["add:37+58=", "rev:3871=", "sort:5193=", "s:1="]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("presets")


@pytest.fixture(scope="module", params=["gpt2-bpe", "llama-char", "qwen2-unigram"])
def policy(request: pytest.FixtureRequest, cache: Path) -> Any:
    return load_policy(ensure_preset(request.param, cache))


def _teacher_forced(model: Any, s: Sample, temperature: float) -> torch.Tensor:
    ids = torch.tensor([s.prompt_token_ids + s.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    p = len(s.prompt_token_ids)
    logp = torch.log_softmax(logits[p - 1 : -1] / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(s.token_ids)[:, None]).squeeze(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_teacher_forcing(policy: Any, temperature: float) -> None:
    model, tok = policy
    out = HFEngine(model, tok).generate(PROMPTS, n=3, max_new_tokens=8, temperature=temperature,
                                        seed=0)
    assert [len(o) for o in out] == [3] * len(PROMPTS)
    for i, group in enumerate(out):
        for s in group:
            assert s.prompt_index == i
            assert s.prompt_token_ids == tok(PROMPTS[i])["input_ids"]
            assert len(s.logprobs) == len(s.token_ids) == len(s.offsets) >= 1
            ref = _teacher_forced(model, s, temperature)
            assert torch.allclose(torch.tensor(s.logprobs), ref, atol=1e-4), (s, ref)


def test_offsets_tile_text(policy: Any) -> None:
    model, tok = policy
    for group in HFEngine(model, tok).generate(PROMPTS, n=4, max_new_tokens=12, seed=1):
        for s in group:
            assert_text_and_offsets(s, tok)
            # Each non-special token's span holds exactly its own decoding (ASCII output).
            for t, (a, b) in zip(s.token_ids, s.offsets, strict=True):
                if t not in tok.all_special_ids and s.text.isascii():
                    assert s.text[a:b] == tok.decode([t])


def test_completion_offsets_handles_split_utf8(cache: Path) -> None:
    _, tok = load_policy(ensure_preset("gpt2-bpe", cache))
    ids = tok("é€x", add_special_tokens=False)["input_ids"]
    text, offs = completion_offsets(tok, ids)
    assert text == "é€x" and offs[-1][1] == len(text) and offs[0][0] == 0
    assert all(a[1] == b[0] for a, b in itertools.pairwise(offs))


def test_stop_strings_end_with_stop(cache: Path) -> None:
    model, tok = load_policy(ensure_preset("llama-char", cache))
    stops = list("0123456789")
    out = HFEngine(model, tok).generate(PROMPTS, n=4, max_new_tokens=20, stop=stops, seed=2)
    reasons = [s.finish_reason for g in out for s in g]
    assert reasons.count("stop") >= len(reasons) - 1
    for s in (s for g in out for s in g):
        if s.finish_reason == "length":
            assert len(s.token_ids) == 20
        elif s.token_ids[-1] == tok.eos_token_id:  # EOS ends a completion too
            assert not any(c in stops for c in s.text)
        else:
            assert s.text[-1] in stops and not any(c in stops for c in s.text[:-1])


class _EosBias(torch.nn.Module):
    """Wraps a model and shifts the EOS logit (forces or forbids stopping at EOS)."""

    def __init__(self, model: Any, eos: int, bias: float) -> None:
        super().__init__()
        self.m, self.eos, self.bias = model, eos, bias

    def get_output_embeddings(self) -> Any:
        return self.m.get_output_embeddings()

    def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any,
                use_cache: bool, cache: Any = None) -> Any:
        out = self.m(input_ids=input_ids, attention_mask=attention_mask,
                     position_ids=position_ids, use_cache=use_cache, cache=cache)
        out.logits[..., self.eos] += self.bias
        return out


def test_eos_gives_stop_and_budget_gives_length(cache: Path) -> None:
    model, tok = load_policy(ensure_preset("llama-char", cache))
    forced = HFEngine(_EosBias(model, tok.eos_token_id, 100.0), tok)
    for s in (s for g in forced.generate(PROMPTS, 2, 10, seed=0) for s in g):
        assert s.finish_reason == "stop" and s.token_ids == [tok.eos_token_id]
        assert s.text == "" and s.offsets == [(0, 0)]
    never = HFEngine(_EosBias(model, tok.eos_token_id, -1e9), tok)
    for s in (s for g in never.generate(PROMPTS, 2, 7, seed=0) for s in g):
        assert s.finish_reason == "length" and len(s.token_ids) == 7


def test_seeded_and_greedy(cache: Path) -> None:
    model, tok = load_policy(ensure_preset("gpt2-bpe", cache))
    eng = HFEngine(model, tok)

    def texts(**kw: Any) -> list[str]:
        return [s.text for g in eng.generate(PROMPTS, 4, 6, **kw) for s in g]

    assert texts(seed=5) == texts(seed=5)
    assert texts(seed=5) != texts(seed=6)
    greedy = texts(temperature=0.0)
    assert texts(temperature=0.0, seed=1) == greedy
    assert texts(top_p=1e-9, seed=3) == greedy  # nucleus of one token is the argmax
    # Greedy repeats within a group; the model is left in training mode as it was.
    assert all(len(set(greedy[i : i + 4])) == 1 for i in range(0, len(greedy), 4))
    model.train()
    eng.generate(PROMPTS[:1], 1, 2, seed=0)
    assert model.training


def test_per_prompt_seeds_make_samples_independent_of_the_other_prompts(cache: Path) -> None:
    # Data-parallel ranks split a round's prompts: a prompt's samples must be the same whichever
    # prompts share its call (its seed alone decides them).
    model, tok = load_policy(ensure_preset("llama-char", cache))
    eng = HFEngine(model, tok)
    seeds = [11, 12, 13, 14]

    def ids(prompts: list[int]) -> list[list[list[int]]]:
        out = eng.generate([PROMPTS[i] for i in prompts], 4, 8, seeds=[seeds[i] for i in prompts])
        return [[s.token_ids for s in g] for g in out]

    together = ids([0, 1, 2, 3])
    assert ids([0, 1]) + ids([2, 3]) == together
    assert ids([3]) == together[3:]
    assert len({tuple(map(tuple, g)) for g in together}) == 4  # the prompts' seeds differ
    with pytest.raises(ValueError, match="seeds"):
        eng.generate(PROMPTS, 1, 2, seeds=[1])


def test_factory_and_sglang_boundary(cache: Path) -> None:
    model, tok = load_policy(ensure_preset("llama-char", cache))
    assert isinstance(make_engine("hf", model, tok), HFEngine)
    with pytest.raises(ValueError, match="unknown rollout engine"):
        make_engine("tgi", model, tok)
    try:
        import sglang  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="needs the sglang package"):
            make_engine("sglang", model, tok, model_path=str(cache))
    with pytest.raises(ValueError):
        HFEngine(model, tok).generate(PROMPTS, 0, 5)


def test_inverse_cdf_draws_the_distribution_and_never_a_zero() -> None:
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3, 0.0])
    n = 20_000
    u = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(_inverse_cdf(probs.expand(n, -1), u), minlength=5).double() / n
    assert freq[1] == 0 and freq[4] == 0
    assert torch.allclose(freq, probs.double(), atol=0.015)  # > 4 sigma at n = 20,000
    # The ends: u = 0 takes the first entry of mass, u x total at the total the last one.
    for block in (1, 2, 3, 1024):  # blocks of one entry, across the zeros, one partial block
        ends = _inverse_cdf(probs.expand(3, -1), torch.tensor([0.0, 0.15, 1.0],
                                                              dtype=torch.float64), block)
        assert ends.tolist() == [0, 2, 3]


def test_inverse_cdf_blocks_agree_with_one_cumulative_sum() -> None:
    g = torch.Generator().manual_seed(1)
    probs = torch.softmax(3 * torch.randn(16, 5003, generator=g), dim=-1)
    probs[:, 100:2000] = 0.0  # whole blocks without mass
    cdf = probs.cumsum(-1, dtype=torch.float64)
    for block in (7, 64, 1024):
        u = torch.rand(16, dtype=torch.float64, generator=g)
        want = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(-1)
        assert torch.equal(_inverse_cdf(probs, u, block), want)


def test_truncation_by_hand() -> None:
    """top_k, then top_p of what top_k left, then min_p of the most likely entry."""
    probs = torch.tensor([[0.05, 0.4, 0.1, 0.3, 0.15]])

    def kept(top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> list[bool]:
        return (_truncate(probs, top_k, top_p, min_p) > 0)[0].tolist()

    assert kept() == [True] * 5
    assert kept(top_k=2) == [False, True, False, True, False]
    assert kept(top_p=0.7) == [False, True, False, True, False]  # 0.4 < 0.7 <= 0.4 + 0.3
    assert kept(top_p=0.71) == [False, True, False, True, True]
    # After top_k = 3 (mass 0.85), top_p 0.5 is 0.425 of it: 0.4 alone falls short.
    assert kept(top_k=3, top_p=0.5) == [False, True, False, True, False]
    assert kept(min_p=0.3) == [False, True, False, True, True]  # >= 0.12
    assert kept(min_p=1.0) == [False, True, False, False, False]
    assert kept(top_k=5) == kept() and kept(top_k=50) == kept()
    assert torch.equal(_truncate(probs, 0, 1.0, 0.0), probs)  # off: the same tensor values


def test_top_k_and_min_p_sample_inside_and_keep_untruncated_logprobs(cache: Path) -> None:
    model, tok = load_policy(ensure_preset("llama-char", cache))
    eng = HFEngine(model, tok)
    greedy = [s.token_ids for g in eng.generate(PROMPTS, 2, 6, temperature=0.0) for s in g]
    for kw in ({"top_k": 1}, {"min_p": 1.0}):
        assert [s.token_ids for g in eng.generate(PROMPTS, 2, 6, seed=3, **kw)
                for s in g] == greedy, kw
    out = eng.generate(PROMPTS, 4, 6, seed=0, top_k=3, top_p=0.9, min_p=0.05)
    for s in (s for g in out for s in g):
        ref = _teacher_forced(model, s, 1.0)  # the untruncated distribution's log-probs
        assert torch.allclose(torch.tensor(s.logprobs), ref, atol=1e-4)
        ids = torch.tensor([s.prompt_token_ids + s.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(s.prompt_token_ids) - 1 : -1]
        rank = (logits > logits.gather(-1, torch.tensor(s.token_ids)[:, None])).sum(-1)
        assert int(rank.max()) < 3  # every token among the 3 most likely


@pytest.mark.parametrize(("kw", "field"), [({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
                                           ({"top_k": -1}, "top_k"), ({"min_p": -0.1}, "min_p"),
                                           ({"min_p": 1.5}, "min_p")])
def test_truncation_knobs_are_checked_by_every_engine(cache: Path, kw: dict[str, Any],
                                                      field: str) -> None:
    model, tok = load_policy(ensure_preset("llama-char", cache))
    with pytest.raises(ValueError, match=field):
        HFEngine(model, tok).generate(PROMPTS, 1, 2, **kw)
    args = {"top_p": 1.0, "top_k": 0, "min_p": 0.0, **kw}
    with pytest.raises(ValueError, match=field):
        sglang_sampling_params(4, 1.0, args["top_p"], args["top_k"], args["min_p"], None)


def test_sglang_gets_the_truncation_knobs() -> None:
    params = sglang_sampling_params(16, 0.7, 0.9, 20, 0.05, ["\n"])
    assert (params["temperature"], params["top_p"], params["top_k"], params["min_p"]) == (
        0.7, 0.9, 20, 0.05)
    assert params["max_new_tokens"] == 16 and params["stop"] == ["\n"]
    assert sglang_sampling_params(16, 1.0, 1.0, 0, 0.0, None)["top_k"] == -1  # SGLang's off
