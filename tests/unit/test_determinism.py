"""The deterministic exchange mode's pure parts: a round's plan from an earlier round's peer
read, the fixed order of peer rollouts, the config rules and the fixed allocation."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mutualrl.trainer.algos.loss import group_advantages
from mutualrl.trainer.data.tasks import Prompt
from mutualrl.trainer.sharing.exchange import PeerRollout
from mutualrl.trainer.sharing.probes.base import Demos, LossInputs, PeerRows, RoundData, delayed
from mutualrl.trainer.sharing.probes.prp import group_peer_rollouts, record_order


@dataclass
class _Sample:
    token_ids: list[int]
    prompt_token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "stop"


def _round(k: int, n: int, g: int = 2) -> RoundData:
    prompts = [Prompt(id=f"r{k}p{i}", skill="add", text=f"{k}+{i}=", answer="") for i in range(n)]
    samples = [[_Sample([7, 8], prompt_token_ids=[100 * k + i, 1]) for _ in range(g)]
               for i in range(n)]
    rewards = torch.tensor([[1.0, 0.0]] * n)
    return RoundData(round=k, prompts=prompts, samples=samples, rewards=rewards)


def test_an_earlier_rounds_peer_data_joins_on_that_rounds_prompts() -> None:
    now, then = _round(5, 3), _round(4, 2)
    earlier = LossInputs(
        advantages=torch.full((2, 2), 9.0),  # round 4's own advantages: not round 5's
        peers=PeerRows(prompt_index=[1, 0], token_ids=[[3], [4]],
                       advantages=torch.tensor([0.5, -0.5]),
                       sender_logp_sum=torch.tensor([-1.0, -2.0], dtype=torch.float64)),
        demos=Demos(prompt_index=[1, 1], token_ids=[[5], [6]]),
        stats={"rescued_prompts": 1.0})
    plan = delayed(now, earlier, then)
    # Own rows of round 5: plain GRPO over their own group.
    assert torch.equal(plan.advantages, group_advantages(now.rewards))
    assert plan.peers is not None and plan.demos is not None
    # Peer rows point past round 5's prompts, at round 4's, which the plan carries.
    assert plan.peers.prompt_index == [4, 3]
    assert plan.extra_prompts == [[400, 1], [401, 1]]
    assert torch.equal(plan.peers.advantages, earlier.peers.advantages)
    # Demonstrations keep round 4's grouping and are conditioned on round 4's prompts.
    assert plan.demos.token_ids == [[5], [6]]
    assert plan.demos.prompt_token_ids == [[401, 1], [401, 1]]
    assert plan.stats == {"rescued_prompts": 1.0, "peer_round": 4.0}


def test_demonstrations_with_their_own_prompts_are_kept_as_they_are() -> None:
    own = Demos(prompt_index=[0], token_ids=[[5]], prompt_token_ids=[[42]])
    plan = delayed(_round(2, 1), LossInputs(torch.zeros(1, 2), demos=own), _round(1, 1))
    assert plan.demos is own and plan.peers is None and plan.extra_prompts == []


def _rollout(policy: str, round_k: int, prompt: int, sample: int) -> PeerRollout:
    return PeerRollout(delivery_id=f"{round_k}-{prompt}-{sample}", policy=policy, round=round_k,
                       prompt_id=f"p{prompt}", text="t", tokenizer_id=f"x/{policy}",
                       token_ids=[1], offsets=[(0, 1)], logprobs=[-1.0], reward=1.0,
                       record_id=f"{policy}/{round_k}/{prompt}/{sample}/r")


@settings(max_examples=50, deadline=None)
@given(st.permutations([(pol, p, k) for pol in ("A", "C") for p in range(3)
                        for k in range(3)]))
def test_peer_rollouts_group_the_same_whatever_their_arrival(
        arrival: list[tuple[str, int, int]]) -> None:
    pool = sorted((_rollout(pol, 2, p, k) for pol, p, k in arrival), key=record_order)
    where = {"p0": 0, "p1": 1, "p2": 2}
    per_prompt, later = group_peer_rollouts(pool, where, 2, cap=2)
    assert later == []
    # The cap keeps each peer's first samples by index, not the first to arrive.
    assert {i: [(r.policy, r.record_id.split("/")[3]) for r in rs]
            for i, rs in per_prompt.items()} == {
        i: [("A", "0"), ("A", "1"), ("C", "0"), ("C", "1")] for i in range(3)}


def test_record_order_is_numeric_in_prompt_and_sample() -> None:
    rs = [_rollout("A", 1, 10, 0), _rollout("A", 1, 2, 11), _rollout("A", 1, 2, 3),
          _rollout("A", 0, 99, 0)]
    assert [r.record_id for r in sorted(rs, key=record_order)] == [
        "A/0/99/0/r", "A/1/2/3/r", "A/1/2/11/r", "A/1/10/0/r"]



@pytest.mark.parametrize("bad", ["A/1/2/r", "A/x/2/3/r", "A/1/2/3/q", "A/1/2/stats/r", ""])
def test_a_malformed_record_id_is_an_error_naming_it(bad: str) -> None:
    from dataclasses import replace

    from mutualrl.trainer.sharing.record_ids import (
        RecordId,
        parse_record_id,
        rollout_id,
        stats_id,
        success_id,
    )

    with pytest.raises(ValueError, match="record id"):
        record_order(replace(_rollout("A", 1, 2, 3), record_id=bad))
    # the writer's ids read back
    assert parse_record_id(rollout_id("A", 1, 2, 3)) == RecordId("A", 1, 2, 3, "r")
    assert parse_record_id(success_id("A", 1, 2, 3)) == RecordId("A", 1, 2, 3, "s")
    assert parse_record_id(stats_id("A", 1, 2)) == RecordId("A", 1, 2, None, "stats")


def _cfg(**fields: object) -> object:
    from mutualrl.trainer.config.run import TrainerConfig

    return TrainerConfig.model_validate({"policies": [{"name": "a", "preset": "gpt2-bpe"},
                                                      {"name": "b", "preset": "llama-char"}],
                                         **fields})


def test_deterministic_mode_needs_one_prompt_count_for_every_policy() -> None:
    det = {"mode": "deterministic", "staleness": 0}
    cfg = _cfg(exchange=det)
    assert cfg.exchange.mode == "deterministic"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match=r"policies\[1\]\.grpo\.prompts_per_round"):
        _cfg(exchange=det, policies=[{"name": "a", "preset": "gpt2-bpe"},
                                     {"name": "b", "preset": "llama-char",
                                      "grpo": {"prompts_per_round": 4}}])
    # The asynchronous mode allows it.
    _cfg(policies=[{"name": "a", "preset": "gpt2-bpe"},
                   {"name": "b", "preset": "llama-char", "grpo": {"prompts_per_round": 4}}])
    for bad, where in (({"mode": "sometimes"}, "mode"), ({"staleness": -1}, "staleness"),
                       ({"liveness_timeout_s": 0}, "liveness_timeout_s")):
        with pytest.raises(ValueError, match=where):
            _cfg(exchange=bad)
