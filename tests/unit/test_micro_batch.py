"""The memory-bounded step (step.py): micro-batched gradients equal the one-shot loss's for every
probe and aggregation mode; per-token log-probs are pinned to an independent reference and to the
rollout engine; PRP's chunk weights are checked by hand; mini-batches make the clip act."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from reference_loss import round_loss
from tiny_round import FakeSample

from mutualrl.trainer.algos.loss import group_advantages
from mutualrl.trainer.algos.prp import peer_weights
from mutualrl.trainer.config.run import GRPOSettings, ProbeSettings
from mutualrl.trainer.data.tasks import Prompt
from mutualrl.trainer.model.batch import completion_logprobs, pack
from mutualrl.trainer.runtime.step import (
    StepSettings,
    accumulate,
    enable_activation_checkpointing,
    micro_batches,
    optimise,
    prepare,
    round_rows,
)
from mutualrl.trainer.sharing.probes import Demos, LossInputs, PeerRows, RoundData

torch.set_num_threads(1)
PAD = 0
MAX_LEN = 8


def tiny_model(seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    """GPT-2 computes in its parameters' dtype throughout (Llama's norms and rotary embeddings
    round through float32, which float64 equality tests cannot tolerate)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=24, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                     pad_token_id=PAD, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model: torch.nn.Module = GPT2LMHeadModel(cfg)
    return model.to(dtype)


PROMPT_IDS = [[1, 5, 6, 7], [1, 8, 9], [1, 3]]
COMPLETIONS = [
    [[10, 11, 2], [12, 2], [10, 13, 14, 2], [15]],
    [[16, 2], [17, 18, 2], [16, 19], [20, 21, 22, 2]],
    [[4, 4, 2], [5, 2], [6], [7, 8, 9, 10, 11, 2]],
]
REWARDS = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])


def fixed_round() -> RoundData:
    samples = [[FakeSample(c) for c in row] for row in COMPLETIONS]
    prompts = [Prompt(id=f"p{i}", skill="add", text=f"p{i}", answer="") for i in range(3)]
    return RoundData(round=0, prompts=prompts, samples=samples, rewards=REWARDS.clone())


def plan_for(kind: str, level: str = "sequence") -> LossInputs:
    adv = group_advantages(REWARDS)
    if kind == "xgrpo":  # a pooled baseline: advantages that are not GRPO's
        adv = (REWARDS - 0.3) / 0.7
    plan = LossInputs(advantages=adv)
    if kind == "prp":
        rows = [[10, 11, 2], [17, 2], [7, 8, 2]]
        plan.peers = PeerRows(
            prompt_index=[0, 1, 2], token_ids=rows, advantages=torch.tensor([0.7, -0.4, 0.2]),
            sender_logp_sum=torch.tensor([-6.0, -9.5, -7.0]),
            token_chunk=[[0, 0, 1], [0, 1], [0, 1, 1]] if level == "chunk" else None,
            chunk_sender_logp=([[-6.1, -2.8], [-3.1, -3.5], [-3.2, -5.9]]
                               if level == "chunk" else None))
    if kind in ("hacpo", "hacpo-naive", "sapo", "ftis"):
        # The receiver gives these rows about -3.2 a token: sender means of -3 put HACPO's
        # sequence ratios around exp(-0.2), some inside its clip band [0.8, 1], some outside.
        plan.peers = PeerRows(
            prompt_index=[0, 1, 2], token_ids=[[10, 11, 2], [17, 2], [7, 8, 2]],
            advantages=torch.tensor([0.7, -0.4, 0.2]),
            sender_logp_sum=torch.tensor([-9.0, -6.0, -9.0]), method=kind,
            sender_tokens=torch.tensor([3.0, 2.0, 3.0]),
            capability=torch.tensor([0.5, 2.0, 1.0]) if kind == "hacpo" else None,
            token_chunk=[[0, 0, 1], [0, 1], [0, 1, 1]] if kind == "ftis" else None,
            chunk_sender_logp=([[-6.1, -2.8], [-3.1, -3.5], [-3.2, -5.9]]
                               if kind == "ftis" else None))
    if kind in ("sgt", "oracle"):
        plan.demos = Demos(prompt_index=[1, 1, 0], token_ids=[[16, 18, 2], [19, 2], [12, 13]])
    if kind == "sgt-self":
        plan.demos = Demos(prompt_index=[0, 0, 1], token_ids=[[16, 18, 2], [19, 2], [5, 6, 7]],
                           prompt_token_ids=[[1, 9, 9, 9, 9], [1, 9, 9, 9, 9], [1, 4]])
    return plan


def grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
            for p in model.parameters()]


def assert_close(a: list[torch.Tensor], b: list[torch.Tensor], rel: float = 1e-10) -> None:
    scale = max(float(x.abs().max()) for x in b)
    assert scale > 0
    worst = max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True))
    assert worst <= rel * scale, (worst, scale)


CASES = [("none", "sequence"), ("xgrpo", "sequence"), ("prp", "sequence"), ("prp", "chunk"),
         ("sgt", "sequence"), ("sgt-self", "sequence"), ("oracle", "sequence"),
         ("hacpo", "sequence"), ("hacpo-naive", "sequence"), ("sapo", "sequence"),
         ("ftis", "chunk")]


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean", "constant_length"])
@pytest.mark.parametrize(("kind", "level"), CASES)
def test_micro_batched_gradients_equal_one_shot(kind: str, level: str, aggregation: str) -> None:
    probe = ProbeSettings(kind=kind, prp_level=level, prp_weight_mode="truncate", prp_cap=3.0,
                          sgt_lambda=0.7)
    one = GRPOSettings(aggregation=aggregation, beta=0.05, filter_zero_variance=True)
    micro = one.model_copy(update={"micro_batch_tokens": 16, "logit_chunk_tokens": 3})
    ref = tiny_model(seed=1)
    model = tiny_model()
    out = round_loss(model, ref, PROMPT_IDS, fixed_round(), plan_for(kind, level), one, probe,
                     PAD, MAX_LEN)
    out.total.backward()
    expected = grads(model)
    model.zero_grad(set_to_none=True)

    data, plan = fixed_round(), plan_for(kind, level)
    rows, _ = round_rows(PROMPT_IDS, data, plan, micro)
    prepare(model, ref, rows, data, plan, StepSettings.of(micro, probe, PAD, MAX_LEN))
    index = list(range(len(rows)))
    assert len(micro_batches(rows, [i for i in index if not rows.demo[i]], 16)) > 3
    stats = accumulate(model, rows, index, StepSettings.of(micro, probe, PAD, MAX_LEN))
    assert_close(grads(model), expected)
    assert stats["loss"] == pytest.approx(float(out.total.detach()), rel=1e-10)
    assert stats["loss_pg"] == pytest.approx(out.stats["loss_pg"], rel=1e-10, abs=1e-14)


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean", "constant_length"])
@pytest.mark.parametrize(("kind", "level"), [("none", "sequence"), ("prp", "chunk"),
                                             ("sgt", "sequence")])
def test_gspo_and_entropy_bonus_micro_batched_equal_one_shot(kind: str, level: str,
                                                             aggregation: str) -> None:
    """The sequence ratio and the entropy bonus's token mean hold across micro-batches too."""
    probe = ProbeSettings(kind=kind, prp_level=level, prp_weight_mode="truncate", prp_cap=3.0)
    one = GRPOSettings(aggregation=aggregation, importance_sampling_level="sequence",
                       entropy_coef=0.1, scale_rewards="none", filter_zero_variance=True)
    micro = one.model_copy(update={"micro_batch_tokens": 16, "logit_chunk_tokens": 3})
    model, data, plan = tiny_model(), fixed_round(), plan_for(kind, level)
    rows, _ = round_rows(PROMPT_IDS, data, plan, micro)
    prepare(model, None, rows, data, plan, StepSettings.of(micro, probe, PAD, MAX_LEN))
    stats = accumulate(model, rows, list(range(len(rows))),
                       StepSettings.of(micro, probe, PAD, MAX_LEN))
    assert stats["entropy"] > 0
    micro_batched = grads(model)
    model.zero_grad(set_to_none=True)
    one_shot = round_loss(model, None, PROMPT_IDS, fixed_round(), plan_for(kind, level), one,
                          probe, PAD, MAX_LEN)
    one_shot.total.backward()
    assert_close(micro_batched, grads(model))
    assert stats["loss"] == pytest.approx(float(one_shot.total.detach()), rel=1e-10)


def test_per_micro_batch_denominators_would_differ() -> None:
    """The equality above is not vacuous: a token mean per micro-batch gives other gradients."""
    micro = GRPOSettings(micro_batch_tokens=16, logit_chunk_tokens=3)
    model = tiny_model()
    data, plan = fixed_round(), plan_for("none")
    rows, _ = round_rows(PROMPT_IDS, data, plan, micro)
    prepare(model, None, rows, data, plan, StepSettings.of(micro, ProbeSettings(), PAD, MAX_LEN))
    index = list(range(len(rows)))
    accumulate(model, rows, index, StepSettings.of(micro, ProbeSettings(), PAD, MAX_LEN))
    right = grads(model)
    model.zero_grad(set_to_none=True)
    for mb in micro_batches(rows, index, 16):  # each micro-batch normalised on its own
        accumulate(model, rows, mb, StepSettings.of(micro, ProbeSettings(), PAD, MAX_LEN))
    worst = max(float((x - y).abs().max()) for x, y in zip(grads(model), right, strict=True))
    assert worst > 1e-6


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean", "constant_length"])
def test_rows_the_mask_leaves_out_take_no_forward_and_change_nothing(aggregation: str) -> None:
    """A zero-variance group (prompt 2) and the peer rows `drop` drops are never forwarded;
    the gradient is still the one-shot loss's, which has them all."""
    probe = ProbeSettings(kind="prp", prp_weight_mode="drop", prp_delta=0.2)
    grpo = GRPOSettings(aggregation=aggregation, filter_zero_variance=True)
    model, data, plan = tiny_model(), fixed_round(), plan_for("prp")
    # The receiver's log-probs of the peer rows are about -3 a token: a sender that gave row 1
    # far more mass than it gets here puts its weight below 1 - delta, the others above 1.
    assert plan.peers is not None
    plan.peers.sender_logp_sum = torch.tensor([-30.0, 0.0, -30.0])
    rows, _ = round_rows(PROMPT_IDS, data, plan, grpo)
    prepare(model, None, rows, data, plan, StepSettings.of(grpo, probe, PAD, MAX_LEN))
    out = [i for i in range(len(rows)) if not bool(rows.mask[i].any())]
    assert out == [8, 9, 10, 11, 13]  # prompt 2's own group, the dropped peer row
    forwarded: list[int] = []
    hook = model.get_input_embeddings().register_forward_hook(
        lambda _m, args, _o: forwarded.append(int(args[0].shape[0])))
    stats = accumulate(model, rows, list(range(len(rows))),
                       StepSettings.of(grpo, probe, PAD, MAX_LEN))
    hook.remove()
    assert sum(forwarded) == len(rows) - len(out)
    skipped = grads(model)
    model.zero_grad(set_to_none=True)
    one_shot = round_loss(model, None, PROMPT_IDS, fixed_round(), plan, grpo, probe, PAD,
                          MAX_LEN)
    one_shot.total.backward()
    assert_close(skipped, grads(model))
    assert stats["loss"] == pytest.approx(float(one_shot.total.detach()), rel=1e-10)


def test_row_longer_than_budget_names_the_field() -> None:
    data, plan = fixed_round(), plan_for("none")
    rows, _ = round_rows(PROMPT_IDS, data, plan, GRPOSettings())
    with pytest.raises(ValueError, match=r"grpo\.micro_batch_tokens"):
        micro_batches(rows, list(range(len(rows))), 7)  # row [1,3]+[7..11,2] has 8 tokens
    with pytest.raises(ValueError, match=r"grpo\.micro_batch_tokens"):
        GRPOSettings(micro_batch_tokens=16, max_new_tokens=16)
    with pytest.raises(ValueError, match=r"grpo\.mini_batches"):
        GRPOSettings(mini_batches=9, prompts_per_round=2, group_size=4)


def reference_logprobs(model: torch.nn.Module, prompt: list[int], completion: list[int],
                       temperature: float) -> torch.Tensor:
    """One row, no padding: log_softmax(logits[p-1:-1] / T).gather(completion)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    p = len(prompt)
    logp = torch.log_softmax(logits[p - 1 : -1] / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(completion)[:, None]).squeeze(-1)


@pytest.mark.parametrize("chunk", [None, 1, 3, 100])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_row_by_row_reference(chunk: int | None, temperature: float) -> None:
    model = tiny_model()
    prompts = [PROMPT_IDS[i] for i in range(3) for _ in range(4)]
    comps = [c for row in COMPLETIONS for c in row]
    batch = pack(prompts, comps, PAD)
    with torch.no_grad():
        got = completion_logprobs(model, batch, temperature, chunk)
    for i, (p, c) in enumerate(zip(prompts, comps, strict=True)):
        ref = reference_logprobs(model, p, c, temperature)
        assert torch.allclose(got[i, : len(c)], ref, rtol=0, atol=1e-10), (i, got[i], ref)
        assert torch.all(got[i, len(c):] == 0)


def test_logprobs_match_the_rollout_engine(tmp_path: Path) -> None:
    from mutualrl.trainer.engines.hf import HFEngine
    from mutualrl.trainer.runtime.presets import ensure_preset, load_policy

    model, tok = load_policy(ensure_preset("llama-char", tmp_path))
    out = HFEngine(model, tok).generate(["add:37+58=", "s:1=", "rev:3871="], n=3,
                                        max_new_tokens=7, temperature=0.8, seed=3)
    samples = [s for row in out for s in row]
    batch = pack([s.prompt_token_ids for s in samples], [s.token_ids for s in samples],
                 tok.pad_token_id)
    with torch.no_grad():
        got = completion_logprobs(model, batch, 0.8, chunk_tokens=4)
    assert len({len(s.prompt_token_ids) for s in samples}) > 1
    for i, s in enumerate(samples):
        assert torch.allclose(got[i, : len(s.token_ids)].float(), torch.tensor(s.logprobs),
                              atol=1e-4), (got[i], s.logprobs)


def test_prp_chunk_weights_by_hand() -> None:
    """Receiver token log-probs and sender chunk log-probs chosen by hand: w = exp(recv - send)
    per chunk, spread on the chunk's tokens (a sign flip gives exp(send - recv) and fails)."""
    logp = torch.tensor([[-0.5, -0.25, -1.0, -2.0], [-0.1, -0.2, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    plan = LossInputs(advantages=torch.zeros(1, 1), peers=PeerRows(
        prompt_index=[0, 0], token_ids=[[1, 2, 3, 4], [5, 6]], advantages=torch.zeros(2),
        sender_logp_sum=torch.zeros(2), token_chunk=[[0, 0, 1, 2], [0, 0]],
        chunk_sender_logp=[[-1.0, -0.5, -2.5], [-0.1]]))
    probe = ProbeSettings(kind="prp", prp_level="chunk", prp_weight_mode="truncate", prp_cap=10.0)
    w, keep, stats = peer_weights(logp, mask, plan.peers, probe)
    # chunk log weights: row 0: (-0.75 + 1.0, -1.0 + 0.5, -2.0 + 2.5) = (0.25, -0.5, 0.5);
    # row 1: -0.3 + 0.1 = -0.2
    e = math.exp
    expected = torch.tensor([[e(0.25), e(0.25), e(-0.5), e(0.5)], [e(-0.2), e(-0.2), 0, 0]],
                            dtype=torch.float64)
    assert torch.allclose(w, expected, atol=1e-12)
    assert torch.equal(keep, mask)
    assert stats["mean_log"] == pytest.approx((0.25 - 0.5 + 0.5 - 0.2) / 4)
    # Drop mode: the chunk at exp(-0.5) < 0.8 leaves the loss, the one above 1 is clamped to 1.
    w, keep, _ = peer_weights(logp, mask, plan.peers, probe.model_copy(
        update={"prp_weight_mode": "drop"}))
    assert keep[0].tolist() == [1.0, 1.0, 0.0, 1.0]
    assert w[0].tolist() == pytest.approx([1.0, 1.0, 0.0, 1.0])
    assert w[1, 0] == pytest.approx(e(-0.2))


def test_prp_sequence_weight_by_hand() -> None:
    logp = torch.tensor([[-0.5, -0.25, -1.0, -2.0]], dtype=torch.float64)
    plan = LossInputs(advantages=torch.zeros(1, 1), peers=PeerRows(
        prompt_index=[0], token_ids=[[1, 2, 3, 4]], advantages=torch.zeros(1),
        sender_logp_sum=torch.tensor([-4.75])))
    probe = ProbeSettings(kind="prp", prp_weight_mode="truncate", prp_cap=10.0)
    w, _, _ = peer_weights(logp, torch.ones_like(logp), plan.peers, probe)
    assert w[0].tolist() == pytest.approx([math.exp((-3.75 + 4.75) / 4)] * 4)


@pytest.mark.parametrize("level", ["sequence", "chunk"])
def test_prp_step_mean_weight_is_exp_delta(level: str) -> None:
    """Sender log-probs = the receiver's minus delta: every weight is exp(delta) (per chunk) or
    exp(delta / |y|) (sequence level, length-normalised)."""
    delta = 0.3
    model = tiny_model()
    data = fixed_round()
    peer_rows = [[10, 11, 2], [17, 18, 2, 5], [7, 2]]
    index = [0, 1, 2]
    with torch.no_grad():
        recv = [completion_logprobs(model, pack([PROMPT_IDS[i]], [r], PAD))[0].tolist()
                for i, r in zip(index, peer_rows, strict=True)]
    chunks = [[j // 2 for j in range(len(r))] for r in peer_rows]  # two tokens per chunk
    send_chunks = [[sum(lp[j] for j in range(len(r)) if c[j] == k) - delta
                    for k in range(max(c) + 1)] for lp, r, c in zip(recv, peer_rows, chunks,
                                                                     strict=True)]
    plan = plan_for("none")
    plan.peers = PeerRows(
        prompt_index=index, token_ids=peer_rows, advantages=torch.tensor([0.5, -0.5, 0.1]),
        sender_logp_sum=torch.tensor([sum(lp) - delta for lp in recv], dtype=torch.float64),
        token_chunk=chunks if level == "chunk" else None,
        chunk_sender_logp=send_chunks if level == "chunk" else None)
    probe = ProbeSettings(kind="prp", prp_level=level, prp_weight_mode="truncate", prp_cap=10.0)
    grpo = GRPOSettings(micro_batch_tokens=16, logit_chunk_tokens=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    res = optimise(model, None, opt, PROMPT_IDS, data, plan,
                   StepSettings.of(grpo, probe, PAD, MAX_LEN))
    if level == "chunk":
        assert res.stats["prp_w_mean"] == pytest.approx(math.exp(delta), rel=1e-9)
        assert res.stats["prp_w_n"] == 2 + 2 + 1
    else:
        want = [math.exp(delta / len(r)) for r in peer_rows]
        assert res.stats["prp_w_mean"] == pytest.approx(sum(want) / 3, rel=1e-9)


def test_mini_batches_make_the_clip_act() -> None:
    """logp_old is taken before the first update: the first mini-batch's ratio is exactly 1 (no
    clip, no KL), later ones see the moved policy (a large lr clips)."""
    model = tiny_model()
    grpo = GRPOSettings(mini_batches=3, epochs=2, micro_batch_tokens=32)
    opt = torch.optim.AdamW(model.parameters(), lr=0.2)
    res = optimise(model, None, opt, PROMPT_IDS, fixed_round(), plan_for("none"),
                   StepSettings.of(grpo, ProbeSettings(), PAD, MAX_LEN))
    assert len(res.updates) == 6
    first = res.updates[0]
    assert first["clip_frac"] == 0.0
    assert first["approx_kl"] == pytest.approx(0.0, abs=1e-12)
    assert max(u["clip_frac"] for u in res.updates[1:]) > 0
    assert min(u["approx_kl"] for u in res.updates[1:]) > 1e-6
    assert res.stats["updates"] == 6.0
    assert 0 < res.stats["clip_frac"] < 1 and res.stats["approx_kl"] > 0


def test_one_update_equals_the_one_shot_step() -> None:
    """mini_batches = epochs = 1: optimise takes exactly the step of round_loss + AdamW."""
    grpo, probe = GRPOSettings(micro_batch_tokens=16), ProbeSettings()
    a, b = tiny_model(), tiny_model()
    opt_a = torch.optim.AdamW(a.parameters(), lr=1e-2)
    opt_b = torch.optim.AdamW(b.parameters(), lr=1e-2)
    res = optimise(a, None, opt_a, PROMPT_IDS, fixed_round(), plan_for("none"),
                   StepSettings.of(grpo, probe, PAD, MAX_LEN))
    loss = round_loss(b, None, PROMPT_IDS, fixed_round(), plan_for("none"), grpo, probe, PAD,
                      MAX_LEN)
    loss.total.backward()
    norm = torch.nn.utils.clip_grad_norm_(b.parameters(), grpo.grad_clip)
    opt_b.step()
    assert res.stats["grad_norm"] == pytest.approx(float(norm), rel=1e-10)
    for x, y in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(x, y, rtol=0, atol=1e-12)


def test_activation_checkpointing_keeps_the_gradients() -> None:
    """grpo.activation_checkpointing recomputes the body in backward: same gradients."""
    grpo = GRPOSettings(micro_batch_tokens=16, logit_chunk_tokens=3, beta=0.0)
    probe = ProbeSettings(kind="sgt", sgt_lambda=0.7)
    plain, ckpt = tiny_model(), tiny_model()
    enable_activation_checkpointing(ckpt)
    ckpt.train()
    out = []
    for model in (plain, ckpt):
        data, plan = fixed_round(), plan_for("sgt")
        rows, _ = round_rows(PROMPT_IDS, data, plan, grpo)
        prepare(model, None, rows, data, plan, StepSettings.of(grpo, probe, PAD, MAX_LEN))
        accumulate(model, rows, list(range(len(rows))), StepSettings.of(grpo, probe, PAD, MAX_LEN))
        out.append(grads(model))
    assert_close(out[1], out[0])


def test_hacpo_peer_rows_follow_the_update_index() -> None:
    """HACPO's lower clip rises with the round's update m: at m = 8 (l = 1) no peer row's ratio
    is inside its band, so its rows add no gradient; at m = 0 two of three do."""
    probe = ProbeSettings(kind="hacpo")
    grpo = GRPOSettings(micro_batch_tokens=16)
    model, data, plan = tiny_model(), fixed_round(), plan_for("hacpo")
    rows, _ = round_rows(PROMPT_IDS, data, plan, grpo)
    st = StepSettings.of(grpo, probe, PAD, MAX_LEN)
    stats = prepare(model, None, rows, data, plan, st)
    assert stats["hacpo_s_below"] == pytest.approx(1 / 3) and stats["hacpo_s_above"] == 0.0
    index = list(range(len(rows)))
    grads_at: dict[int, list[torch.Tensor]] = {}
    for update in (0, 8):
        model.zero_grad(set_to_none=True)
        accumulate(model, rows, index, st, update=update)
        grads_at[update] = grads(model)
    # The same round without its peer rows' advantages: the gradient of own rows alone.
    model.zero_grad(set_to_none=True)
    rows.advantages[~rows.own] = 0.0
    accumulate(model, rows, index, st, update=8)
    assert_close(grads_at[8], grads(model))
    worst = max(float((a - b).abs().max()) for a, b in zip(grads_at[0], grads_at[8],
                                                           strict=True))
    assert worst > 1e-6


def test_ftis_gate_leaves_negative_peer_rows_out_of_the_step() -> None:
    """A KL gate below every row's estimate filters the negative peer row (row 1), keeps the
    positive ones, and the micro-batched gradient is still the one-shot loss's."""
    probe = ProbeSettings(kind="ftis", ftis_kl_gate=0.0, ftis_cap=1.5)
    one = GRPOSettings()
    micro = one.model_copy(update={"micro_batch_tokens": 16, "logit_chunk_tokens": 3})
    model, data, plan = tiny_model(), fixed_round(), plan_for("ftis")
    rows, _ = round_rows(PROMPT_IDS, data, plan, micro)
    st = StepSettings.of(micro, probe, PAD, MAX_LEN)
    stats = prepare(model, None, rows, data, plan, st)
    peer = [i for i in range(len(rows)) if not rows.own[i]]
    assert stats["ftis_filtered"] == 1.0
    assert [bool(rows.mask[i].any()) for i in peer] == [True, False, True]
    assert float(rows.weights[peer].max()) <= 1.5
    accumulate(model, rows, list(range(len(rows))), st)
    micro_batched = grads(model)
    model.zero_grad(set_to_none=True)
    one_shot = round_loss(model, None, PROMPT_IDS, fixed_round(), plan_for("ftis"), one, probe,
                          PAD, MAX_LEN)
    one_shot.total.backward()
    assert_close(micro_batched, grads(model))
