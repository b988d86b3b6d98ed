"""HACPO, SAPO and F-TIS's math (`algos.hacpo`, `algos.sapo`, `algos.ftis`, `algos.methods`)
pinned to numbers worked out by hand in the comments and, on random small batches, to the
plain-Python reference `tests/reference_collab.py` written from the papers' equations:
HACPO's capability over a history, its weighted baseline and its guards, the peer rows' clipped
sequence ratio, its stop-gradient and stepwise clip (values and gradients); SAPO's separate
groups and what it drops; F-TIS's truncation, KL estimate and mask."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import get_args

import pytest
import reference_collab as ref
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mutualrl.trainer.algos import ftis, hacpo, sapo
from mutualrl.trainer.algos.loss import group_advantages
from mutualrl.trainer.algos.methods import METHODS
from mutualrl.trainer.algos.prp import pooled_advantages
from mutualrl.trainer.config.run import ProbeKind, ProbeSettings

S = ProbeSettings(kind="hacpo")


@dataclass
class Group:
    rewards: torch.Tensor
    source: list[str] = field(default_factory=list)
    baseline_weight: torch.Tensor | None = None


def t(xs: list[float]) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float64)


# HACPO: capability ---------------------------------------------------------------------------

def test_capability_over_a_history_by_hand() -> None:
    cap = hacpo.Capability(window=5)
    for k, m in enumerate([0.2, 0.4, 0.6, 0.8, 1.0, 0.5]):
        cap.record("A", k, m)
    cap.record("B", 4, 0.1)
    cap.record("B", 5, 0.3)
    # A: the last five rounds 0.4, 0.6, 0.8, 1.0, 0.5 -> 3.3 / 5 = 0.66; B: (0.1 + 0.3) / 2.
    assert cap.of("A") == pytest.approx(0.66)
    assert cap.of("B") == pytest.approx(0.2)
    assert cap.of("A") == pytest.approx(ref.capability([0.2, 0.4, 0.6, 0.8, 1.0, 0.5], 5))
    assert cap.ratio("A", "B", 0.1, 10.0) == pytest.approx(3.3)
    assert cap.ratio("B", "A", 0.1, 10.0) == pytest.approx(0.2 / 0.66)
    assert cap.ratio("A", "B", 0.1, 3.0) == 3.0  # clipped
    cap.record("C", 5, 0.0)  # no reward yet: P is floored, the clip bounds the ratio
    assert cap.of("C") == 1e-8
    assert cap.ratio("A", "C", 0.1, 10.0) == 10.0
    assert cap.ratio("C", "A", 0.1, 10.0) == 0.1
    assert cap.of("nobody") == 1.0  # before any round
    cap.record("B", 5, 0.5)  # a round recorded again replaces its entry
    assert cap.of("B") == pytest.approx(0.3)
    again = hacpo.Capability(window=5)
    again.load_state_dict(cap.state_dict())
    assert again.rounds == cap.rounds


@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=12), st.integers(1, 6))
def test_capability_matches_the_reference(means: list[float], window: int) -> None:
    cap = hacpo.Capability(window)
    for k, m in enumerate(means):
        cap.record("A", k, m)
    assert cap.of("A") == pytest.approx(ref.capability(means, window), rel=1e-12)


# HACPO: advantages ---------------------------------------------------------------------------

def test_hacpo_advantages_by_hand() -> None:
    # Own [1, 0, 0, 0]; peer B's [1, 0] weighted 2 in the baseline:
    # mu = (1 + 0 + 0 + 0 + 2*1 + 2*0) / 6 = 0.5; the plain std of [1,0,0,0,1,0] is sqrt(2/9).
    own = t([1.0, 0.0, 0.0, 0.0]).unsqueeze(0)
    peers = [Group(t([1.0, 0.0]), ["B", "B"], t([2.0, 2.0]))]
    own_adv, peer_adv = hacpo.hacpo_advantages(own, peers, "group", S)
    sd = math.sqrt(2 / 9) + 1e-6
    assert own_adv[0].tolist() == pytest.approx([0.5 / sd, -0.5 / sd, -0.5 / sd, -0.5 / sd])
    assert peer_adv[0].tolist() == pytest.approx([0.5 / sd, -0.5 / sd])
    assert 0.5 / sd == pytest.approx(1.0606579, rel=1e-6)
    # The guard: own [1, 0], peers [1, 1] weighted 2 -> (1 + 0 + 2 + 2) / 4 = 1.25 > 1, so the
    # baseline is the own mean 0.5; std of [1, 0, 1, 1] = sqrt(3/16).
    own_adv, peer_adv = hacpo.hacpo_advantages(
        t([1.0, 0.0]).unsqueeze(0), [Group(t([1.0, 1.0]), ["B", "B"], t([2.0, 2.0]))],
        "group", S)
    sd = math.sqrt(3 / 16) + 1e-6
    assert own_adv[0].tolist() == pytest.approx([0.5 / sd, -0.5 / sd])
    assert peer_adv[0].tolist() == pytest.approx([0.5 / sd, 0.5 / sd])
    # No guard: the weighted baseline 1.25 stands.
    no_cap = S.model_copy(update={"hacpo_baseline_cap": None})
    _, peer_adv = hacpo.hacpo_advantages(
        t([1.0, 0.0]).unsqueeze(0), [Group(t([1.0, 1.0]), ["B", "B"], t([2.0, 2.0]))],
        "group", no_cap)
    assert peer_adv[0].tolist() == pytest.approx([-0.25 / sd, -0.25 / sd])
    # All rewards equal: the weights make no signal.
    own_adv, peer_adv = hacpo.hacpo_advantages(
        t([1.0, 1.0]).unsqueeze(0), [Group(t([1.0]), ["B"], t([10.0]))], "group", S)
    assert own_adv.abs().max() == 0 and peer_adv[0].abs().max() == 0


def test_prompts_without_peers_keep_grpo_and_naive_is_the_pooled_group() -> None:
    own = t([1.0, 0.0, 1.0, 0.5, 0.0, 0.0, 1.0, 1.0]).reshape(2, 4)
    peers = [Group(t([])), Group(t([1.0, 0.0, 0.0]), ["B"] * 3, t([3.0, 3.0, 3.0]))]
    own_adv, _ = hacpo.hacpo_advantages(own, peers, "group", S)
    assert torch.equal(own_adv[0], group_advantages(own)[0])
    # Every baseline weight 1 (hacpo-naive): exactly PRP's pooled group.
    naive = [Group(p.rewards, p.source, None) for p in peers]
    got_own, got_peer = hacpo.hacpo_advantages(own, naive, "group", S)
    want_own, want_peer = pooled_advantages(own, [p.rewards for p in peers])
    assert torch.allclose(got_own, want_own, atol=1e-12)
    assert torch.allclose(got_peer[1], want_peer[1], atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=2, max_size=6),
       st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0]), st.floats(0.1, 10.0)),
                min_size=1, max_size=6),
       st.sampled_from(["group", "batch", "none"]), st.sampled_from([1.0, None]))
def test_hacpo_advantages_match_the_reference(own: list[float], peers: list[tuple[float, float]],
                                              scale: str, cap: float | None) -> None:
    s = S.model_copy(update={"hacpo_baseline_cap": cap})
    got_own, got_peer = hacpo.hacpo_advantages(
        t(own).unsqueeze(0), [Group(t([r for r, _ in peers]), ["B"] * len(peers),
                                    t([w for _, w in peers]))], scale, s)  # type: ignore[arg-type]
    want_own, want_peer = ref.hacpo_advantages(own, peers, cap, scale)
    assert got_own[0].tolist() == pytest.approx(want_own, rel=1e-9, abs=1e-9)
    assert got_peer[0].tolist() == pytest.approx(want_peer, rel=1e-9, abs=1e-9)


# HACPO: the peer rows' loss ------------------------------------------------------------------

def cross(logp: list[list[float]], sender_mean: list[float], adv: list[float], w: list[float],
          s: ProbeSettings, update: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token values and d(sum of values)/d logp through `cross_token_loss`."""
    lp = t([row + [0.0] * (4 - len(row)) for row in logp]).requires_grad_(True)
    mask = t([[1.0] * len(row) + [0.0] * (4 - len(row)) for row in logp])
    beh = t(sender_mean).unsqueeze(-1).expand_as(mask)
    out = hacpo.cross_token_loss(lp, beh, t(adv), t(w).unsqueeze(-1).expand_as(mask), mask, s,
                                 update)
    (out.total * mask).sum().backward()
    assert lp.grad is not None
    return out.total.detach(), lp.grad


def test_hacpo_peer_row_by_hand() -> None:
    # Receiver log-probs [-1, -2] (mean -1.5), sender mean -1.4: log s = -0.1, s = 0.904837,
    # inside [0.8, 1] at update 0. Value -s * s * w * A = -0.818731 * 2 * 0.5 = -0.818731 on
    # each token; d value / d logp_t = -s * s * w * A / n = -0.409365.
    values, grad = cross([[-1.0, -2.0]], [-1.4], [0.5], [2.0], S)
    s = math.exp(-0.1)
    assert values[0, :2].tolist() == pytest.approx([-s * s] * 2)
    assert grad[0, :2].tolist() == pytest.approx([2 * (-s * s / 2)] * 2)  # two tokens' values
    assert grad[0, 2:].abs().max() == 0
    # Update 8: l_8 = min(1, 0.8 + 8 * 0.025) = 1, so s is clipped to 1: value -1, no gradient.
    assert hacpo.cross_lower(S, 8) == 1.0
    values, grad = cross([[-1.0, -2.0]], [-1.4], [0.5], [2.0], S, update=8)
    assert values[0, :2].tolist() == pytest.approx([-1.0, -1.0])
    assert grad.abs().max() == 0
    # Below the band: s = exp(-0.5) = 0.607 < 0.8, clipped up to 0.8: value -0.64, no gradient.
    values, grad = cross([[-1.0, -2.0]], [-1.0], [0.5], [2.0], S)
    assert values[0, :2].tolist() == pytest.approx([-0.64, -0.64])
    assert grad.abs().max() == 0
    # Above 1: s = exp(0.3) clipped to 1 (a negative advantage: value +1 * 1 * 2 * 0.5).
    values, grad = cross([[-1.0, -2.0]], [-1.8], [-0.5], [2.0], S)
    assert values[0, :2].tolist() == pytest.approx([1.0, 1.0])
    assert grad.abs().max() == 0
    # alpha = 0: sg(s)^0 = 1, the plain clipped ratio: d value / d logp_t = -s * w * A / n.
    values, grad = cross([[-1.0, -2.0]], [-1.4], [0.5], [2.0],
                         S.model_copy(update={"hacpo_alpha": 0.0}))
    assert values[0, 0] == pytest.approx(-s)
    assert grad[0, 0] == pytest.approx(2 * (-s / 2))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(-4.0, -0.01), min_size=1, max_size=4), st.floats(-4.0, -0.01),
       st.floats(-2.0, 2.0), st.floats(0.1, 10.0), st.integers(0, 12), st.floats(0.0, 2.0),
       st.floats(0.5, 3.0))
def test_hacpo_peer_row_matches_the_reference(logp: list[float], sender: float, adv: float,
                                              w: float, update: int, alpha: float,
                                              max_log: float) -> None:
    s = S.model_copy(update={"hacpo_alpha": alpha, "hacpo_max_log_ratio": max_log})
    values, grad = cross([logp], [sender], [adv], [w], s, update)
    want, want_grad = ref.hacpo_peer_row(logp, sender, adv, w, ref.hacpo_lower(0.2, 0.025, update),
                                         alpha, max_log)
    n = len(logp)
    assert values[0, :n].tolist() == pytest.approx([want] * n, rel=1e-9, abs=1e-12)
    # Every token's value depends on every token: the gradient of the row's sum is n times.
    assert grad[0, :n].tolist() == pytest.approx([n * g for g in want_grad], rel=1e-7, abs=1e-9)


def test_hacpo_row_weights_and_behaviour() -> None:
    @dataclass
    class Rows:
        sender_logp_sum: torch.Tensor
        sender_tokens: torch.Tensor | None
        capability: torch.Tensor | None

    logp = t([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]])
    mask = t([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    rows = Rows(t([-2.8, -6.0]), t([2.0, 4.0]), t([0.5, 3.0]))
    out = hacpo.cross_rows(logp, mask, rows, S)
    # Sender means -1.4 and -1.5 on every token; row weights 0.5 and 3 on every token.
    assert out.behaviour.tolist() == [[-1.4] * 3, [-1.5] * 3]
    assert out.weights.tolist() == [[0.5] * 3, [3.0] * 3]
    # log s: -1.5 + 1.4 = -0.1 and -0.5 + 1.5 = 1.0 (above 1).
    assert out.stats["hacpo_log_s"] == pytest.approx((-0.1 + 1.0) / 2)
    assert out.stats["hacpo_s_above"] == 0.5 and out.stats["hacpo_s_below"] == 0.0
    with pytest.raises(ValueError, match="token count"):
        hacpo.cross_rows(logp, mask, Rows(t([-2.8, -6.0]), None, None), S)


# SAPO ----------------------------------------------------------------------------------------

def test_sapo_peer_groups_are_separate_groups() -> None:
    # Own [1, 0]; B's group [1, 1, 0] and C's group [0, 1] for the same prompt: each peer row's
    # advantage is within its own source's group, never pooled with own or the other peer's.
    own = t([1.0, 0.0]).unsqueeze(0)
    g = Group(t([1.0, 0.0, 1.0, 1.0, 0.0]), ["B", "C", "B", "C", "B"])
    own_adv, peer_adv = sapo.per_source_advantages(own, [g], "group")
    assert torch.equal(own_adv, group_advantages(own))
    b = ref.group_advantages([1.0, 1.0, 0.0])  # B's rows 0, 2, 4
    c = ref.group_advantages([0.0, 1.0])  # C's rows 1, 3
    assert peer_adv[0].tolist() == pytest.approx([b[0], c[0], b[1], c[1], b[2]])
    # by hand: B mean 2/3, std sqrt(2)/3 -> +0.7071, -1.4142; C -> -1, +1
    assert b[0] == pytest.approx(1 / math.sqrt(2), rel=1e-5)
    assert c == pytest.approx([-1.0, 1.0], rel=1e-5)
    assert peer_adv[0].tolist() == pytest.approx(
        ref.per_source(list(zip(g.source, g.rewards.tolist(), strict=True))))


def test_sapo_drops_zero_advantage_groups_and_draws_at_most_max() -> None:
    advs = [t([0.0, 0.0]), t([1.0, -1.0]), t([0.5, -0.5]), t([0.0]), t([2.0, -2.0])]
    s = ProbeSettings(kind="sapo")
    assert sapo.chosen_groups(advs, s, random.Random(0)) == [False, True, True, False, True]
    keep = s.model_copy(update={"sapo_drop_zero_advantage": False})
    assert all(sapo.chosen_groups(advs, keep, random.Random(0)))
    two = s.model_copy(update={"sapo_max_groups": 2})
    got = sapo.chosen_groups(advs, two, random.Random(7))
    assert sum(got) == 2 and not got[0] and not got[3]
    assert got == sapo.chosen_groups(advs, two, random.Random(7))  # seeded: replayable


# F-TIS ---------------------------------------------------------------------------------------

@dataclass
class Chunks:
    advantages: torch.Tensor
    token_chunk: list[list[int]] | None
    chunk_sender_logp: list[list[float]] | None


def test_ftis_truncation_and_kl_mask_by_hand() -> None:
    # Row 0: receiver tokens [-0.5, -0.25 | -1.0 | -2.0] in chunks (0, 0, 1, 2); the generator
    # gave the chunks [-1.75, -0.5, -3.0]: log w = (-0.75+1.75, -1.0+0.5, -2.0+3.0) = (1, -0.5, 1)
    # -> w = (min(e, 2), e^-0.5, min(e, 2)) = (2, 0.6065, 2).
    # KL̂ = sum of r log r - r + 1: e*1 - e + 1 = 1 (twice), e^-0.5*(-0.5) - e^-0.5 + 1 = 0.0902.
    # Row 1 (one token per chunk, as with one tokenizer): log w = -0.1 + 0.3 = 0.2.
    logp = t([[-0.5, -0.25, -1.0, -2.0], [-0.1, 0.0, 0.0, 0.0]])
    mask = t([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    rows = Chunks(t([-1.0, 0.4]), [[0, 0, 1, 2], [0]], [[-1.75, -0.5, -3.0], [-0.3]])
    s = ProbeSettings(kind="ftis")  # C = 2, g = 50
    out = ftis.ftis_rows(logp, mask, rows, s)
    e = math.e
    assert out.weights[0].tolist() == pytest.approx([2.0, 2.0, math.exp(-0.5), 2.0])
    assert out.weights[1, 0] == pytest.approx(math.exp(0.2))
    kl0 = 2 * 1.0 + (math.exp(-0.5) * -0.5 - math.exp(-0.5) + 1)
    assert out.kl[0] == pytest.approx(kl0)
    assert out.kl[1] == pytest.approx(math.exp(0.2) * 0.2 - math.exp(0.2) + 1)
    assert out.stats["ftis_truncated"] == pytest.approx(2 / 4)  # 2 of the 4 chunks
    assert torch.equal(out.keep, mask)  # KL 2.09 < 50: nothing filtered
    w, kl = ref.ftis_chunks([-0.75, -1.0, -2.0], [-1.75, -0.5, -3.0], 2.0)
    assert w == pytest.approx([2.0, e ** -0.5, 2.0]) and kl == pytest.approx(kl0)
    # A gate below row 0's KL filters it (negative advantage), never row 1 (positive).
    tight = s.model_copy(update={"ftis_kl_gate": 0.001})
    out = ftis.ftis_rows(logp, mask, rows, tight)
    assert out.keep[0].abs().max() == 0 and torch.equal(out.keep[1], mask[1])
    assert out.stats["ftis_filtered"] == 1.0
    # The cap: C = 10 leaves e^1 untruncated.
    out = ftis.ftis_rows(logp, mask, rows, s.model_copy(update={"ftis_cap": 10.0}))
    assert out.weights[0, 0] == pytest.approx(e)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-6.0, -0.01), st.floats(-6.0, -0.01)), min_size=1,
                max_size=5),
       st.floats(-2.0, 2.0), st.floats(0.5, 4.0), st.floats(0.0, 5.0))
def test_ftis_matches_the_reference(pairs: list[tuple[float, float]], adv: float, cap: float,
                                    gate: float) -> None:
    recv, send = [a for a, _ in pairs], [b for _, b in pairs]
    n = len(pairs)
    rows = Chunks(t([adv]), [list(range(n))], [send])
    s = ProbeSettings(kind="ftis", ftis_cap=cap, ftis_kl_gate=gate)
    out = ftis.ftis_rows(t([recv]), torch.ones(1, n, dtype=torch.float64), rows, s)
    w, kl = ref.ftis_chunks(recv, send, cap)
    assert out.weights[0].tolist() == pytest.approx(w, rel=1e-12)
    assert float(out.kl[0]) == pytest.approx(kl, rel=1e-9, abs=1e-12)
    assert bool(out.keep[0].any()) == ref.ftis_kept(adv, kl, gate)


def test_ftis_kl_of_a_huge_ratio_is_finite() -> None:
    rows = Chunks(t([-1.0]), [[0]], [[-900.0]])
    out = ftis.ftis_rows(t([[-0.1]]), t([[1.0]]), rows, ProbeSettings(kind="ftis"))
    assert math.isfinite(float(out.kl[0])) and out.keep.abs().max() == 0


# The registry ---------------------------------------------------------------------------------

def test_every_peer_probe_has_a_function_set() -> None:
    kinds = set(get_args(ProbeKind))
    assert set(METHODS) == {"prp", "hacpo", "hacpo-naive", "sapo", "ftis"} <= kinds
    assert METHODS["hacpo"].token_loss is hacpo.cross_token_loss
    assert all(METHODS[k].token_loss is None for k in ("prp", "sapo", "ftis"))


# SAPO's rescoring ------------------------------------------------------------------------------

def test_sapo_rescores_peer_completions_with_its_own_task() -> None:
    """The learner's verifier decides a peer completion's reward, not the sender's report: a
    correct answer reported as 0 scores 1, a wrong one reported as 1 scores 0, and a completion
    the sender's budget cut scores 0 whatever its text."""
    from mutualrl.trainer.data.tasks import Prompt, SyntheticTask
    from mutualrl.trainer.sharing.exchange import PeerRollout
    from mutualrl.trainer.sharing.probes import RoundData
    from mutualrl.trainer.sharing.probes.sapo import SAPOProbe

    task = SyntheticTask(regime="short", skills=["add"])
    p0 = Prompt(id="add:3+4=", skill="add", text="add:3+4=", answer="7")
    p1 = Prompt(id="add:5+5=", skill="add", text="add:5+5=", answer="10")
    data = RoundData(round=0, prompts=[p0, p1], samples=[[], []], rewards=t([[0.0], [0.0]]))

    def peer(prompt: Prompt, text: str, reported: float, cut: bool = False) -> PeerRollout:
        return PeerRollout("d", "B", 0, prompt.id, text, "tok", [], [], [], reported,
                           truncated=cut)

    chosen = [peer(p0, "7;", 0.0), peer(p0, "8;", 1.0), peer(p1, "10;", 1.0, cut=True)]
    probe = SAPOProbe(ProbeSettings(kind="sapo"), "A", None, task)
    got = probe.rescore(data, chosen, [0, 0, 1], [[1], [2], [3]])
    assert got == {0: [1.0, 0.0], 1: [0.0]}
    assert SAPOProbe(ProbeSettings(kind="sapo"), "A", None, None).rescore(
        data, chosen, [0, 0, 1], [[1], [2], [3]]) is None  # no task: the senders' rewards
