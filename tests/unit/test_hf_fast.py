"""The HF engine's fast path on a CPU (the code a GPU runs, eagerly): behaviour log-probs equal
the trainer's teacher-forced ones; a prompt's samples depend on its seed alone (alone, with
other prompts, on another data-parallel rank, at any check interval or batch bucket); stops,
EOS, finish reasons and offsets equal the dynamic-cache loop's on the same token ids; the
decode step reads nothing back to the host; the static cache is reused across calls; the
sampling copy follows the optimizer; a model the fast path cannot run falls back, said once."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sample_checks import assert_text_and_offsets

from mutualrl.trainer.engines.base import Sample
from mutualrl.trainer.engines.hf import HFEngine
from mutualrl.trainer.engines.sampling import reference_uniform, row_keys, uniforms
from mutualrl.trainer.model.batch import completion_logprobs, pack
from mutualrl.trainer.runtime.presets import ensure_preset, load_policy

torch.set_num_threads(1)

PROMPTS = ["add:37+58=", "rev:3871=", "sort:5193=", "s:1="]
SEEDS = [11, 12, 13, 14]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("presets")


@pytest.fixture(scope="module", params=["gpt2-bpe", "llama-char", "qwen2-unigram"])
def policy(request: pytest.FixtureRequest, cache: Path) -> Any:
    return load_policy(ensure_preset(request.param, cache))


def _flat(out: list[list[Sample]]) -> list[Sample]:
    return [s for row in out for s in row]


def _teacher_forced(model: Any, samples: list[Sample], temperature: float,
                    pad: int) -> torch.Tensor:
    """The trainer's own log-probs of the samples (`model.batch`, as the loss computes them)."""
    batch = pack([s.prompt_token_ids for s in samples], [s.token_ids for s in samples], pad)
    with torch.no_grad():
        return completion_logprobs(model, batch, temperature, chunk_tokens=16)


@pytest.mark.parametrize(("temperature", "truncation"), [
    (1.0, {}), (0.7, {}), (1.0, {"top_k": 5, "top_p": 0.9, "min_p": 0.02})])
def test_logprobs_equal_the_trainers_teacher_forced(policy: Any, temperature: float,
                                                    truncation: dict[str, Any]) -> None:
    model, tok = policy
    eng = HFEngine(model, tok)
    assert eng.decoder is not None and eng.stats()["fast_path"] == 1.0
    samples = _flat(eng.generate(PROMPTS, n=3, max_new_tokens=10, temperature=temperature,
                                 seeds=SEEDS, **truncation))
    got = _teacher_forced(model, samples, temperature, tok.pad_token_id)
    for i, s in enumerate(samples):
        assert len(s.logprobs) == len(s.token_ids) == len(s.offsets) >= 1
        diff = (got[i, : len(s.token_ids)].float() - torch.tensor(s.logprobs)).abs().max()
        assert float(diff) <= 1e-4, (i, s)


def _ids(eng: HFEngine, which: list[int], **kw: Any) -> list[list[list[int]]]:
    out = eng.generate([PROMPTS[i] for i in which], 4, 12, seeds=[SEEDS[i] for i in which], **kw)
    return [[s.token_ids for s in row] for row in out]


def test_a_prompts_samples_depend_on_its_seed_alone(cache: Path) -> None:
    """Alone, with other prompts, split as two data-parallel ranks split a round, at every
    check interval and in the graphs' batch buckets and windows: the same ids."""
    model, tok = load_policy(ensure_preset("llama-char", cache))
    together = _ids(HFEngine(model, tok), [0, 1, 2, 3], stop=["7"])
    assert len({tuple(map(tuple, g)) for g in together}) == 4  # the prompts' seeds differ
    for eng in (HFEngine(model, tok), HFEngine(model, tok, stop_check_every=3),
                HFEngine(model, tok, cuda_graphs=True, window_tokens=4),
                HFEngine(model, tok, cuda_graphs=True, stop_check_every=5)):
        assert _ids(eng, [0, 1], stop=["7"]) + _ids(eng, [2, 3], stop=["7"]) == together
        assert _ids(eng, [3], stop=["7"]) == together[3:]
        assert _ids(eng, [2, 0], stop=["7"]) == [together[2], together[0]]
    shaped = HFEngine(model, tok, cuda_graphs=True, window_tokens=4)
    _ids(shaped, [0, 1, 2, 3], stop=["7"])
    assert shaped.stats()["compactions"] >= 1  # rows that stopped left a 16-row batch


class _Scripted(torch.nn.Module):
    """A model whose next token is nearly certain: `table[last token, position]` gets +30 on
    the wrapped model's logits, so every engine draws the same ids, with stops and EOS where
    the table puts them."""

    def __init__(self, model: Any, table: torch.Tensor) -> None:
        super().__init__()
        self.m, self.table = model, table
        self.config = model.config

    def get_output_embeddings(self) -> Any:
        return self.m.get_output_embeddings()

    def forward(self, input_ids: Any, position_ids: Any = None, cache: Any = None,
                **kwargs: Any) -> Any:
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1])[None].expand_as(input_ids)
        out = self.m(input_ids=input_ids, position_ids=position_ids, cache=cache, **kwargs)
        rows = input_ids[:, -out.logits.shape[1]:]
        pos = position_ids[:, -out.logits.shape[1]:] % self.table.shape[1]
        out.logits += 30.0 * torch.nn.functional.one_hot(self.table[rows, pos],
                                                         out.logits.shape[-1])
        return out


@pytest.mark.parametrize("shape", [{}, {"stop_check_every": 4},
                                   {"cuda_graphs": True, "window_tokens": 8,
                                    "stop_check_every": 3}])
def test_stops_eos_and_offsets_equal_the_dynamic_loop(cache: Path,
                                                      shape: dict[str, Any]) -> None:
    model, tok = load_policy(ensure_preset("llama-char", cache))
    vocab = model.get_output_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(0)
    table = torch.randint(0, vocab, (vocab, 64), generator=g)
    table[torch.rand(vocab, 64, generator=g) < 0.01] = tok.eos_token_id
    scripted = _Scripted(model, table)
    fast, loop = HFEngine(scripted, tok, **shape), HFEngine(scripted, tok, fast_path=False)
    assert fast.decoder is not None and loop.decoder is None
    prompts = [*PROMPTS, "a", "rev:12=", "add:5+5=", "sort:90817263="]
    free = [s.text for s in _flat(loop.generate(prompts, 1, 24, seeds=list(range(8))))]
    long = sorted(free, key=len)[-2:]
    # Stops that occur: one character, two characters (a stop across tokens), two stops.
    stops = [[long[1][5]], [long[1][9:11]], [long[0][3], long[1][14]], None]
    seen: set[str] = set()
    for stop in stops:
        a = _flat(fast.generate(prompts, 3, 24, stop=stop, seeds=list(range(8))))
        b = _flat(loop.generate(prompts, 3, 24, stop=stop, seeds=list(range(8))))
        for x, y in zip(a, b, strict=True):
            assert x.token_ids == y.token_ids, stop
            assert (x.text, x.offsets, x.finish_reason, x.prompt_token_ids) == (
                y.text, y.offsets, y.finish_reason, y.prompt_token_ids), stop
            assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)) < 1e-4
            assert_text_and_offsets(x, tok)
        ends = {"length" if s.finish_reason == "length" else
                "eos" if s.token_ids[-1] == tok.eos_token_id else "text" for s in a}
        assert ("text" in ends) == (stop is not None), (stop, ends)
        seen |= ends
    assert seen == {"length", "eos", "text"}  # every way a completion ends occurred


SYNCS = {"_local_scalar_dense", "nonzero", "item", "is_nonzero", "unique_dim", "_unique2",
         "masked_select", "equal"}
"""aten ops that read a device value back to the host (or need a data-dependent shape)."""


def test_the_decode_step_reads_nothing_back_to_the_host(policy: Any) -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    from mutualrl.trainer.engines.static_decode import Sampling, cache_kwarg

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: set[str] = set()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            self.names.add(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    model, tok = policy
    eng = HFEngine(model, tok, cuda_graphs=True, window_tokens=16)
    eng.generate(PROMPTS, 2, 6, seeds=SEEDS)  # the pool holds 8 rows of this call
    p = eng.decoder.pool
    before = {name: t.data_ptr() for name, t in vars(p).items() if isinstance(t, torch.Tensor)}
    ops = Ops()
    model.eval()
    for sampling in (Sampling(1.0, (0, 1.0, 0.0), tok.eos_token_id),
                     Sampling(0.7, (3, 1.0, 0.1), tok.eos_token_id),
                     Sampling(0.0, (0, 1.0, 0.0), None)):
        with torch.inference_mode(), ops:
            eng.decoder._step(model, 8, 16, sampling, cache_kwarg(model))
    assert ops.names and not ops.names & SYNCS, ops.names & SYNCS
    assert "index_put_" not in ops.names and "scatter" not in ops.names
    after = {name: t.data_ptr() for name, t in vars(p).items() if isinstance(t, torch.Tensor)}
    assert after == before  # every write in place: a graph replays into the same memory


def test_the_static_cache_is_reused_while_the_shape_fits(cache: Path) -> None:
    model, tok = load_policy(ensure_preset("llama-char", cache))
    eng = HFEngine(model, tok)
    for _ in range(2):
        eng.generate(PROMPTS, 4, 8, seeds=SEEDS)
    assert eng.stats()["pool_allocations"] == 1
    eng.generate(PROMPTS[:2], 2, 8, seeds=SEEDS[:2])  # fewer rows: the same pool
    assert eng.stats()["pool_allocations"] == 1
    eng.generate(PROMPTS, 8, 8, seeds=SEEDS)  # more rows: a larger pool
    assert eng.stats()["pool_allocations"] == 2
    eng.generate(PROMPTS, 4, 100, seeds=SEEDS)  # longer: a longer pool
    assert eng.stats()["pool_allocations"] == 3
    assert eng.decoder.pool.rows == 32 and eng.decoder.pool.length == 128


def test_the_sampling_copy_follows_the_optimizer_through_sync(cache: Path) -> None:
    model, tok = load_policy(ensure_preset("llama-char", cache))
    eng = HFEngine(model, tok, weights="copy", compute_dtype="bfloat16")
    copy = eng._sampler()
    assert copy is not model and next(copy.parameters()).dtype == torch.bfloat16
    # The copy's log-probs are those of the bf16 weights: within bf16 of the trainer's.
    samples = _flat(eng.generate(PROMPTS, 2, 8, seeds=SEEDS))
    got = _teacher_forced(model, samples, 1.0, tok.pad_token_id)
    diffs = [abs(float(got[i, j]) - lp) for i, s in enumerate(samples)
             for j, lp in enumerate(s.logprobs)]
    assert max(diffs) < 0.15 and sum(diffs) / len(diffs) < 0.03
    before = _ids(eng, [0, 1])
    opt = torch.optim.SGD(model.parameters(), lr=2.0)
    ids = torch.tensor([tok("add:37+58=95")["input_ids"]])
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    assert _ids(eng, [0, 1]) == before  # not synced: the copy still holds the old weights
    eng.sync_weights(model)
    for name, t in model.named_parameters():
        assert torch.equal(dict(copy.named_parameters())[name], t.detach().to(torch.bfloat16))
    assert _ids(eng, [0, 1]) != before


def test_autocast_weights_sample_from_the_master(cache: Path) -> None:
    model, tok = load_policy(ensure_preset("qwen2-unigram", cache))
    eng = HFEngine(model, tok, weights="autocast", compute_dtype="bfloat16")
    assert eng._sampler() is model and eng.decoder is not None
    samples = _flat(eng.generate(PROMPTS, 2, 8, seeds=SEEDS))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _teacher_forced(model, samples, 1.0, tok.pad_token_id)
    diffs = [abs(float(got[i, j]) - lp) for i, s in enumerate(samples)
             for j, lp in enumerate(s.logprobs)]
    assert max(diffs) < 0.15


def _sliding_window_model(tok: Any) -> Any:
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    return MistralForCausalLM(MistralConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=4,
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id))


def test_a_model_the_fast_path_cannot_run_falls_back_with_one_warning(
        cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    _, tok = load_policy(ensure_preset("llama-char", cache))
    model = _sliding_window_model(tok)
    with caplog.at_level(logging.WARNING, logger="mutualrl.trainer.engines.hf"):
        eng = HFEngine(model, tok, policy="mistral-sw")
        samples = _flat(eng.generate(PROMPTS, 2, 9, seeds=SEEDS))
        eng.generate(PROMPTS, 2, 9, seeds=SEEDS)
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1
    assert "mistral-sw" in warned[0].message and "DynamicSlidingWindowLayer" in warned[0].message
    assert eng.decoder is None and eng.stats() == {"fast_path": 0.0}
    got = _teacher_forced(model, samples, 1.0, tok.pad_token_id)
    for i, s in enumerate(samples):
        assert torch.allclose(got[i, : len(s.token_ids)].float(), torch.tensor(s.logprobs),
                              atol=1e-4)


class _NoCache(torch.nn.Module):
    """A causal LM that ignores the cache it is given (a decode step sees one token)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.m = model
        self.config = model.config

    def get_output_embeddings(self) -> Any:
        return self.m.get_output_embeddings()

    def forward(self, input_ids: Any, attention_mask: Any = None, **kwargs: Any) -> Any:
        return self.m(input_ids=input_ids)


def test_a_model_that_ignores_the_cache_falls_back(
        cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    model, tok = load_policy(ensure_preset("llama-char", cache))
    with caplog.at_level(logging.WARNING, logger="mutualrl.trainer.engines.hf"):
        eng = HFEngine(_NoCache(model), tok, policy="plain")
    assert eng.decoder is None
    assert "plain" in caplog.text and "other logits than a full forward" in caplog.text


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(min_value=-(2**63), max_value=2**64 - 1),
       sample=st.integers(min_value=0, max_value=10_000),
       step=st.integers(min_value=0, max_value=2**20))
def test_counter_uniforms_match_their_definition(seed: int, sample: int, step: int) -> None:
    key = row_keys([seed], sample + 1)[sample]
    keys = torch.tensor([key, key])
    u = uniforms(keys, torch.tensor(step))
    assert u.tolist() == [reference_uniform(key, step)] * 2
    assert 0.0 <= float(u[0]) < 1.0
    assert torch.equal(u, uniforms(keys, step))


def test_counter_uniforms_are_uniform_and_independent_across_rows_and_steps() -> None:
    keys = torch.tensor(row_keys(range(64), 64))
    u = torch.stack([uniforms(keys, t) for t in range(8)])  # [8 steps, 4096 rows]
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.var()) - 1 / 12) < 0.005
    hist = torch.histc(u.float(), bins=10, min=0.0, max=1.0) / u.numel()
    assert float((hist - 0.1).abs().max()) < 0.01
    corr = torch.corrcoef(torch.stack([u[0], u[1], u[:, 0].repeat(512)]))
    assert float(corr[0, 1].abs()) < 0.05
    assert len(set(u.flatten().tolist())) == u.numel()


def test_a_lora_policy_samples_from_its_merged_copy(cache: Path) -> None:
    from mutualrl.trainer.config.run import LoraSettings
    from mutualrl.trainer.model import lora
    from mutualrl.trainer.model.lora import sync_tensors

    model, tok = load_policy(ensure_preset("llama-char", cache))
    peft = lora.wrap(model, LoraSettings(rank=2, target_modules=["q_proj", "o_proj"]))
    with torch.no_grad():  # adapters away from zero, so that merging them matters
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    eng = HFEngine(peft, tok, weights="copy", compute_dtype="float32")
    copy, merged = eng._sampler(), dict(sync_tensors(peft))
    assert not hasattr(copy, "get_base_model")  # the base architecture, adapters merged
    for name, p in copy.named_parameters():
        assert torch.equal(p, merged[name]), name
    samples = _flat(eng.generate(PROMPTS, 2, 8, seeds=SEEDS))
    got = _teacher_forced(peft, samples, 1.0, tok.pad_token_id)
    for i, s in enumerate(samples):
        diff = (got[i, : len(s.token_ids)].float() - torch.tensor(s.logprobs)).abs().max()
        assert float(diff) <= 1e-4, i
