"""SGT's controls and the stability-support diagnostics on a tiny model: sgt-self draws SGT's
count of demonstrations from its own earlier successes only; demonstrations on earlier rounds'
prompts score under their own prompts; diagnostics never change training."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch
from reference_loss import round_loss

from mutualrl.trainer.config.run import GRPOSettings, ProbeSettings
from mutualrl.trainer.data.tasks import Prompt
from mutualrl.trainer.engines.base import Sample
from mutualrl.trainer.sharing.probes import Demos, RoundData, make_probe
from mutualrl.trainer.sharing.probes.prp import group_peer_rollouts
from mutualrl.trainer.sharing.probes.sgt import OracleProbe, SGTProbe, SGTSelfProbe, draw_own

torch.set_num_threads(1)
PAD = 0




def tiny_model(seed: int = 0) -> torch.nn.Module:
    """A 2-layer GPT-2 without dropout (the trainer-step tests use a Llama)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=24, n_embd=32, n_layer=2, n_head=4,
                                      n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                      attn_pdrop=0.0, pad_token_id=PAD))


def round_data(k: int, rewards: list[list[float]], finish: str = "stop") -> RoundData:
    prompts = [Prompt(id=f"r{k}p{i}", skill="add", text=f"r{k}p{i}", answer="")
               for i in range(len(rewards))]
    samples = [[Sample(i, [10 + g, 2], f"r{k}p{i}g{g}", [], [], finish, [1, 3 + i])
                for g in range(len(row))] for i, row in enumerate(rewards)]
    return RoundData(round=k, prompts=prompts, samples=samples, rewards=torch.tensor(rewards))


def test_sgt_self_pool_holds_only_earlier_verified_own_successes() -> None:
    probe = make_probe(ProbeSettings(kind="sgt-self", sgt_self_rounds=2), "A", None)
    assert isinstance(probe, SGTSelfProbe)
    probe.plan(round_data(0, [[1.0, 0.0], [0.0, 0.0]]))
    probe.plan(round_data(1, [[0.0, 1.0], [1.0, 1.0]]))
    probe.plan(round_data(2, [[1.0, 1.0], [0.0, 0.0]], finish="length"))  # truncated: none
    # Round 0 fell out of the 2-round window; round 2 is never in its own pool.
    assert sorted(probe.pool(2)) == ["r1p0", "r1p1"]
    assert probe.pool(2)["r1p1"] == ([1, 4], ["r1p1g0", "r1p1g1"])
    assert probe.pool(3) == probe.pool(2)  # round 2 had no verified success
    assert probe.pool(1) == {}  # round 0 is gone, round 1 is not earlier than itself
    restored = make_probe(ProbeSettings(kind="sgt-self", sgt_self_rounds=2), "A", None)
    restored.load_state_dict(probe.state_dict())
    assert isinstance(restored, SGTSelfProbe) and restored.pool(3) == probe.pool(3)


def test_sgt_self_matches_sgt_counts_when_the_pool_allows() -> None:
    pool = {f"p{i}": ([1, i], [f"a{i}", f"b{i}", f"c{i}"][: 1 + i % 3]) for i in range(10)}
    want = [1, 3, 2]  # SGT rescued three prompts with 1, 3 and 2 distinct peer texts
    drawn = draw_own(pool, want, random.Random(0))
    labels = [j for j, _, _, _ in drawn]
    assert sorted(set(labels)) == [0, 1, 2]
    for j, n in enumerate(want):
        pids = {pid for jj, pid, _, _ in drawn if jj == j}
        assert len(pids) == 1  # one own prompt per group
        pid = pids.pop()
        texts = [t for jj, _, ids, t in drawn if jj == j and ids == pool[pid][0]]
        assert texts == pool[pid][1][:n]  # up to n texts of that prompt
    assert draw_own(pool, want, random.Random(0)) == drawn  # seeded
    assert draw_own({}, want, random.Random(0)) == []
    assert len({j for j, _, _, _ in draw_own(pool, [1] * 20, random.Random(1))}) == 10


class CharTokens:
    """The one exchange method the controls' demonstrations use: texts -> receiver tokens."""

    eos_token_id = 2

    def retokenize(self, texts: list[str], ends: list[bool]) -> list[list[int]]:
        return [[3 + (ord(c) % 20) for c in t] + ([2] if e else []) for t, e in
                zip(texts, ends, strict=True)]


def test_controls_report_what_they_trained_on_not_the_peers_texts() -> None:
    """The transfer matrix counts `rescue_demos/<skill>/<source>`: SGT's peer texts by donor,
    sgt-self's own texts under its own name and skill, the oracle's under `reference`."""
    from mutualrl.trainer.sharing.probes.base import Rescue

    probe = make_probe(ProbeSettings(kind="sgt-self", sgt_self_rounds=4), "A", None)
    assert isinstance(probe, SGTSelfProbe)
    data0 = round_data(0, [[1.0, 1.0], [1.0, 0.0]])
    data0.prompts[1] = Prompt(id="r0p1", skill="rev", text="r0p1", answer="")
    probe.plan(data0)
    data1 = round_data(1, [[0.0, 0.0], [0.0, 0.0]])
    texts = {"r1p0": ["peer-a", "peer-b"], "r1p1": ["peer-c"]}  # SGT would rescue both
    rescue = Rescue(texts=texts, donors={("r1p0", "peer-a"): "B", ("r1p0", "peer-b"): "C",
                                         ("r1p1", "peer-c"): "B"})
    stats: dict[str, float] = {}
    demos = probe.demonstrations(data1, CharTokens(), texts,  # type: ignore[arg-type]
                                 Demos(prompt_index=[0, 0, 1], token_ids=[[5], [6], [7]]), stats)
    assert demos is not None and len(demos) == 3  # r0p0 has 2 texts, r0p1 one: 2 + 1
    taught = probe.taught(data1, rescue, demos)
    assert taught == {"rescue_demos/add/A": 2.0, "rescue_demos/rev/A": 1.0}
    sgt = make_probe(ProbeSettings(kind="sgt"), "A", None)
    assert isinstance(sgt, SGTProbe)
    assert sgt.taught(data1, rescue, demos) == {"rescue_demos/add/B": 2.0,
                                                "rescue_demos/add/C": 1.0}
    oracle = make_probe(ProbeSettings(kind="oracle"), "A", None)
    assert isinstance(oracle, OracleProbe)
    refs = Demos(prompt_index=[0, 1], token_ids=[[5], [6]])
    assert oracle.taught(data1, rescue, refs) == {"rescue_demos/add/reference": 2.0}



def test_demos_on_earlier_prompts_use_their_own_prompt_tokens() -> None:
    model = tiny_model()
    prompt_ids = [[1, 5, 6], [1, 7]]
    data = round_data(0, [[1.0, 0.0], [0.0, 0.0]])
    plan = make_probe(ProbeSettings(kind="sgt"), "A", None).plan(data)
    settings = ProbeSettings(kind="sgt", sgt_lambda=1.0)
    plan.demos = Demos(prompt_index=[1], token_ids=[[16, 2]])
    by_index = round_loss(model, None, prompt_ids, data, plan, GRPOSettings(), settings, PAD, 4)
    plan.demos = Demos(prompt_index=[7], token_ids=[[16, 2]], prompt_token_ids=[[1, 7]])
    explicit = round_loss(model, None, prompt_ids, data, plan, GRPOSettings(), settings, PAD, 4)
    assert explicit.stats["loss_sgt"] == pytest.approx(by_index.stats["loss_sgt"], abs=1e-6)
    plan.demos = Demos(prompt_index=[0], token_ids=[[16, 2]], prompt_token_ids=[[1, 9, 9, 9]])
    other = round_loss(model, None, prompt_ids, data, plan, GRPOSettings(), settings, PAD, 4)
    assert other.stats["loss_sgt"] != pytest.approx(by_index.stats["loss_sgt"], abs=1e-6)


@dataclass
class Roll:
    policy: str
    round: int
    prompt_id: str


def test_prp_cap_counts_per_peer() -> None:
    where = {"x": 0, "y": 1}
    pool = ([Roll("B", 3, "x")] * 5 + [Roll("C", 3, "x")] * 5 + [Roll("B", 3, "y")] * 2
            + [Roll("C", 4, "x")] * 2 + [Roll("B", 3, "z")])
    per_prompt, later = group_peer_rollouts(pool, where, 3, cap=3)  # type: ignore[arg-type]
    assert [r.policy for r in per_prompt[0]] == ["B"] * 3 + ["C"] * 3
    assert len(per_prompt[1]) == 2 and len(later) == 2


def test_diagnostics_leave_training_unchanged() -> None:
    """KL to a copy of itself is 0; support is the demos' mean token log-prob; measuring both
    before a step leaves the step's weights and the RNG stream exactly as without."""
    from mutualrl.trainer.runtime.diagnostics import demos_logp, kl_to_start

    prompt_ids = [[1, 5, 6], [1, 7]]
    data = round_data(0, [[1.0, 0.0], [0.0, 1.0]])
    start = tiny_model()
    demos = Demos(prompt_index=[0, 1], token_ids=[[16, 2], [17, 18, 2]])

    def step(measure: bool) -> tuple[list[torch.Tensor], torch.Tensor, dict[str, float]]:
        model = tiny_model()
        torch.manual_seed(5)
        stats: dict[str, float] = {}
        if measure:
            stats = kl_to_start(model, start, prompt_ids, data, 3, PAD)
            stats["support"] = demos_logp(model, prompt_ids, demos, PAD)[0]
        plan = make_probe(ProbeSettings(), "A", None).plan(data)
        loss = round_loss(model, None, prompt_ids, data, plan, GRPOSettings(), ProbeSettings(),
                          PAD, 4)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        loss.total.backward()
        opt.step()
        return [p.detach().clone() for p in model.parameters()], torch.rand(1), stats

    plain_w, plain_rng, _ = step(False)
    w, rng, stats = step(True)
    assert all(torch.equal(a, b) for a, b in zip(plain_w, w, strict=True))
    assert torch.equal(plain_rng, rng)
    assert stats["kl_warm"] == pytest.approx(0.0, abs=1e-6)
    assert stats["support"] < 0.0
    moved = tiny_model()
    with torch.no_grad():
        for p_new, p_old in zip(moved.parameters(), w, strict=True):
            p_new.copy_(p_old)
    assert kl_to_start(moved, start, prompt_ids, data, 8, PAD)["kl_warm"] > 1e-6


def test_support_is_the_mean_token_logprob() -> None:
    from mutualrl.trainer.model.batch import completion_logprobs, pack
    from mutualrl.trainer.runtime.diagnostics import demos_logp

    model = tiny_model().eval()
    prompt_ids = [[1, 5, 6], [1, 7]]
    demos = Demos(prompt_index=[0, 1], token_ids=[[16, 2], [17, 18, 2]])
    mean, n = demos_logp(model, prompt_ids, demos, PAD)
    with torch.no_grad():
        a = completion_logprobs(model, pack([prompt_ids[0]], [[16, 2]], PAD)).sum()
        b = completion_logprobs(model, pack([prompt_ids[1]], [[17, 18, 2]], PAD)).sum()
    assert n == 5 and mean == pytest.approx(float(a + b) / 5, abs=1e-5)
