"""Trainer step on a tiny model: a step lowers the GRPO loss, probes without peers are GRPO,
SGT raises the rescued text's likelihood, and --resume reproduces an uninterrupted run."""

from __future__ import annotations

import pytest
import torch
from reference_loss import round_loss
from tiny_round import PAD, fixed_round, tiny_model

from mutualrl.trainer.algos.loss import group_advantages
from mutualrl.trainer.config.run import GRPOSettings, ProbeSettings
from mutualrl.trainer.sharing.probes import Demos, make_probe

torch.set_num_threads(1)


def loss_of(model: torch.nn.Module, plan_kind: str = "none", grpo: GRPOSettings | None = None):
    prompt_ids, data = fixed_round()
    probe = make_probe(ProbeSettings(kind=plan_kind), "A", None)
    plan = probe.plan(data)
    return round_loss(model, None, prompt_ids, data, plan, grpo or GRPOSettings(),
                      ProbeSettings(kind=plan_kind), PAD, 8)


def test_step_changes_weights_and_lowers_loss() -> None:
    from mutualrl.trainer.algos.loss import grpo_loss
    from mutualrl.trainer.model.batch import completion_logprobs, pack

    model = tiny_model()
    prompt_ids, data = fixed_round()
    batch = pack([prompt_ids[i // 4] for i in range(8)],
                 [s.token_ids for row in data.samples for s in row], PAD)
    adv = group_advantages(data.rewards).reshape(-1)
    with torch.no_grad():
        old = completion_logprobs(model, batch)
    before = [p.detach().clone() for p in model.parameters()]
    first = loss_of(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first.total.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    # The fixed batch's GRPO loss against the pre-step policy (rho = pi_new / pi_old) drops.
    with torch.no_grad():
        after = grpo_loss(completion_logprobs(model, batch), old, adv, batch.completion_mask,
                          GRPOSettings())
    assert float(after.loss) < float(first.total.detach()) - 1e-4


def test_probes_without_peers_are_grpo_exactly() -> None:
    base = loss_of(tiny_model())
    for kind in ("xgrpo", "sgt", "prp", "sgt-self", "oracle"):
        other = loss_of(tiny_model(), kind)
        assert torch.equal(other.total, base.total), kind


def test_grpo_settings_change_the_loss() -> None:
    """The probe comparison above would be vacuous if the loss ignored its inputs."""
    base = loss_of(tiny_model())
    agg = loss_of(tiny_model(), grpo=GRPOSettings(aggregation="grpo"))
    assert not torch.equal(agg.total, base.total)


def test_sgt_step_raises_rescued_likelihood() -> None:
    from mutualrl.trainer.model.batch import completion_logprobs, pack

    model = tiny_model()
    prompt_ids, data = fixed_round()
    data.rewards = torch.zeros(2, 4)  # prompt 1 failed everywhere: it is rescued
    demo = [16, 18, 21, 2]
    probe = make_probe(ProbeSettings(kind="sgt"), "A", None)
    plan = probe.plan(data)
    plan.demos = Demos(prompt_index=[1], token_ids=[demo])
    batch = pack([prompt_ids[1]], [demo], PAD)
    with torch.no_grad():
        before = float(completion_logprobs(model, batch).sum())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    out = round_loss(model, None, prompt_ids, data, plan, GRPOSettings(),
                     ProbeSettings(kind="sgt", sgt_lambda=1.0), PAD, 8)
    assert out.stats["loss_sgt"] > 0
    out.total.backward()
    opt.step()
    with torch.no_grad():
        after = float(completion_logprobs(model, batch).sum())
    assert after > before + 1e-3


@pytest.mark.parametrize("level", ["sequence", "chunk"])
def test_prp_peer_equal_to_self_has_unit_weights(level: str) -> None:
    """A peer row that is one of our own samples, with our own log-probs: w = 1 (drop mode)."""
    from mutualrl.trainer.model.batch import completion_logprobs, pack
    from mutualrl.trainer.sharing.probes import PeerRows

    model = tiny_model()
    prompt_ids, data = fixed_round()
    row = data.samples[0][0].token_ids
    with torch.no_grad():
        lp = completion_logprobs(model, pack([prompt_ids[0]], [row], PAD))[0].tolist()
    plan = make_probe(ProbeSettings(kind="prp"), "A", None).plan(data)
    plan.peers = PeerRows(
        prompt_index=[0], token_ids=[row], advantages=torch.tensor([0.5]),
        sender_logp_sum=torch.tensor([sum(lp)]),
        token_chunk=[list(range(len(row)))] if level == "chunk" else None,
        chunk_sender_logp=[lp] if level == "chunk" else None)
    out = round_loss(model, None, prompt_ids, data, plan, GRPOSettings(),
                     ProbeSettings(kind="prp", prp_level=level), PAD, 8)
    assert abs(out.stats["prp_w_mean"] - 1.0) < 1e-5
    assert out.stats["prp_w_kept"] == 1.0


@pytest.fixture(scope="module")
def preset_cache(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("presets")


def _local_cfg(out, rounds: int = 3, ckpt_every: int = 1):
    from mutualrl.trainer.config.run import TrainerConfig

    return TrainerConfig.model_validate({
        "run_id": "resume", "output_dir": str(out), "services": {"local": True},
        "grpo": {"group_size": 4, "prompts_per_round": 4, "rounds": rounds,
                 "lr_schedule": "cosine", "warmup_rounds": 1},
        "task": {"format_reward": 0.5},
        "eval": {"every": 0}, "checkpoint": {"every": ckpt_every, "keep": 1},
        "metrics": {"tensorboard": False, "progress": False},
        "policies": [{"name": "A", "preset": "llama-char"}]})


def test_resume_reproduces_uninterrupted_run(tmp_path, preset_cache) -> None:
    import json

    from mutualrl.trainer.runtime.loop import run_round, train
    from mutualrl.trainer.runtime.session import build_session

    straight = build_session(_local_cfg(tmp_path / "a"), "A", cache_dir=preset_cache)
    train(straight)
    straight.close()

    # Interrupted after round 3 was logged but before it was checkpointed (every 2 rounds).
    first = build_session(_local_cfg(tmp_path / "b", ckpt_every=2), "A", cache_dir=preset_cache)
    train(first, rounds=2)
    run_round(first, 2)
    first.metrics.log(2, {"loss": 123.0})
    first.close()
    resumed = build_session(_local_cfg(tmp_path / "b"), "A", resume=True, cache_dir=preset_cache)
    assert resumed.start_round == 2
    train(resumed)
    resumed.close()

    for (name, a), b in zip(straight.model.named_parameters(), resumed.model.parameters(),
                            strict=True):
        assert torch.equal(a, b), name
    rows_a = [json.loads(x) for x in (tmp_path / "a/resume/A/metrics.jsonl").read_text().split(
        "\n") if x]
    rows_b = [json.loads(x) for x in (tmp_path / "b/resume/A/metrics.jsonl").read_text().split(
        "\n") if x]
    assert [r["round"] for r in rows_b] == [0, 1, 2]
    assert rows_a[2]["loss"] == rows_b[2]["loss"]
    assert rows_a[2]["reward_mean"] == rows_b[2]["reward_mean"]
    # Training moved the weights at all (the comparison above would be vacuous otherwise).
    fresh = build_session(_local_cfg(tmp_path / "c"), "A", cache_dir=preset_cache)
    assert any(not torch.equal(a, b) for a, b in zip(fresh.model.parameters(),
                                                     straight.model.parameters(), strict=True))
    fresh.close()


def test_kl_to_frozen_reference() -> None:
    """beta > 0: KL is 0 against an identical reference and positive once the policy moved."""
    import copy

    model = tiny_model()
    ref = copy.deepcopy(model).requires_grad_(False)
    prompt_ids, data = fixed_round()
    plan = make_probe(ProbeSettings(), "A", None).plan(data)
    grpo = GRPOSettings(beta=0.1)
    first = round_loss(model, ref, prompt_ids, data, plan, grpo, ProbeSettings(), PAD, 8)
    assert first.stats["kl"] == 0.0
    opt = torch.optim.AdamW(model.parameters(), lr=5e-2)
    first.total.backward()
    opt.step()
    second = round_loss(model, ref, prompt_ids, data, plan, grpo, ProbeSettings(), PAD, 8)
    assert second.stats["kl"] > 1e-6
    no_kl = round_loss(model, ref, prompt_ids, data, plan, GRPOSettings(), ProbeSettings(),
                       PAD, 8)
    assert float(second.total.detach()) > float(no_kl.total.detach())


def test_ratio_to_behaviour_logprobs() -> None:
    """With the sampler's log-probs equal to the trainer's, the loss is the on-policy one;
    stale behaviour log-probs make rho != 1 and move it."""
    from mutualrl.trainer.model.batch import completion_logprobs, pack

    model = tiny_model()
    prompt_ids, data = fixed_round()
    rows = [s for row in data.samples for s in row]
    batch = pack([prompt_ids[i // 4] for i in range(8)], [s.token_ids for s in rows], PAD)
    with torch.no_grad():
        lp = completion_logprobs(model, batch)
    for i, s in enumerate(rows):
        s.logprobs = lp[i, : len(s.token_ids)].tolist()
    plan = make_probe(ProbeSettings(), "A", None).plan(data)
    base = round_loss(model, None, prompt_ids, data, plan, GRPOSettings(), ProbeSettings(),
                      PAD, 8)
    beh = round_loss(model, None, prompt_ids, data, plan, GRPOSettings(ratio_to_behaviour=True),
                     ProbeSettings(), PAD, 8)
    assert abs(float(beh.total.detach()) - float(base.total.detach())) < 1e-6
    for s in rows:
        s.logprobs = [x - 0.5 for x in s.logprobs]  # behaviour was less likely: rho = e^0.5
    stale = round_loss(model, None, prompt_ids, data, plan,
                       GRPOSettings(ratio_to_behaviour=True), ProbeSettings(), PAD, 8)
    assert stale.stats["clip_frac_high"] > 0
