"""The asynchronous mode's bounded lead (`exchange.max_lead_rounds`) against a real SEE: a
policy far ahead of its peer waits for the peer's round r - L before it reads, and then shares;
a peer that never comes costs `liveness_timeout_s`, said in the round's metrics."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from service_loop import RolloutSample as Sample
from service_loop import see_server

from mutualrl.client.runs import delete_run
from mutualrl.trainer.config.run import ExchangeSettings, ProbeSettings
from mutualrl.trainer.config.task import JsonlTaskConfig
from mutualrl.trainer.data.task_factory import make_task
from mutualrl.trainer.data.tasks import Prompt, Task
from mutualrl.trainer.engines.base import completion_offsets
from mutualrl.trainer.runtime.presets import ensure_preset, load_policy
from mutualrl.trainer.sharing.exchange import PeerExchange, round_records
from mutualrl.trainer.sharing.probes import LossInputs, RoundData, make_probe

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def see_address(redis_url: str) -> Iterator[str]:
    with see_server(redis_url, "lead") as address:
        yield address


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Task:
    path = tmp_path_factory.mktemp("task") / "train.jsonl"
    rows = [{"id": f"q{i}", "question": f"{i}+{i}=", "answer": f"#### {2 * i}"}
            for i in range(1, 9)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return make_task(JsonlTaskConfig(path=path, heldout_fraction=0.0,
                                     fallback_last_number=True))


class Side:
    """One policy of the pair: its exchange and how it answers (right or wrong)."""

    def __init__(self, run_id: str, name: str, address: str, tok: Any, right: bool) -> None:
        self.run_id, self.name, self.tok, self.right = run_id, name, tok, right
        self.ex = PeerExchange(run_id, name, f"{run_id}/{name}", address, None, tok)

    def round(self, task: Task, k: int) -> RoundData:
        prompts = task.round_prompts(k, 2, 0)
        samples = [[self._sample(p) for _ in range(2)] for p in prompts]
        ok = [[self.right] * 2 for _ in prompts]
        rewards = [[float(self.right)] * 2 for _ in prompts]
        return RoundData(round=k, prompts=prompts, samples=samples,
                         rewards=torch.tensor(rewards), correct=ok)

    def publish(self, data: RoundData) -> None:
        assert self.ex.publish(round_records(
            self.run_id, self.name, data.round, data.round, f"{self.run_id}/{self.name}",
            data.prompts, data.samples, data.rewards.tolist(), data.correct, 1.0,
            self.tok.eos_token_id))

    def _sample(self, p: Prompt) -> Sample:
        text = p.answer if self.right else "0"
        ids = list(self.tok(text, add_special_tokens=False)["input_ids"])
        decoded, offsets = completion_offsets(self.tok, ids)
        return Sample(ids, decoded, offsets, [-0.5] * len(ids), "stop",
                      list(self.tok(p.text)["input_ids"]))


@pytest.fixture
def pair(see_address: str, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[Side, Side]]:
    cache = tmp_path_factory.getbasetemp() / "presets"
    run_id = f"lead-{uuid.uuid4().hex[:8]}"
    paths = {f"{run_id}/{n}": str(ensure_preset(p, cache))
             for n, p in (("fast", "gpt2-bpe"), ("slow", "llama-char"))}
    fast = Side(run_id, "fast", see_address, load_policy(Path(paths[f"{run_id}/fast"]))[1],
                right=False)
    slow = Side(run_id, "slow", see_address, load_policy(Path(paths[f"{run_id}/slow"]))[1],
                right=True)
    try:
        for side in (fast, slow):
            side.ex.join(["fast", "slow"], paths)
        yield fast, slow
    finally:
        fast.ex.close()
        slow.ex.close()
        delete_run(run_id, see=see_address)


def _probe(side: Side, task: Task, lead: int | None, liveness: float = 30.0) -> Any:
    return make_probe(ProbeSettings(kind="sgt", tau=1.0, deadline_seconds=0.3), side.name,
                      side.ex, task=task,
                      sharing=ExchangeSettings(mode="asynchronous", max_lead_rounds=lead,
                                               liveness_timeout_s=liveness))


def _plan_later(probe: Any, data: RoundData) -> tuple[threading.Thread, dict[str, LossInputs]]:
    out: dict[str, LossInputs] = {}
    thread = threading.Thread(target=lambda: out.setdefault("plan", probe.plan(data)))
    thread.start()
    return thread, out


def test_a_policy_one_round_ahead_waits_for_the_peer_round_before_it(
        pair: tuple[Side, Side], task: Task) -> None:
    fast, slow = pair
    probe = _probe(fast, task, lead=1)
    r0 = fast.round(task, 0)
    fast.publish(r0)
    p0 = probe.plan(r0)  # round 0: nothing to keep pace with; the peer has published nothing
    assert p0.stats["fallback"] == 1.0 and p0.stats["shared"] == 0.0
    assert "lead_wait_s" not in p0.stats
    r1 = fast.round(task, 1)
    fast.publish(r1)
    thread, out = _plan_later(probe, r1)
    thread.join(1.0)
    assert thread.is_alive()  # held: the slow peer has not published its round 0
    slow.publish(slow.round(task, 0))
    slow.publish(slow.round(task, 1))
    thread.join(10.0)
    assert not thread.is_alive()
    p1 = out["plan"].stats
    assert p1["lead_timeout"] == 0.0 and p1["lead_wait_s"] >= 1.0
    # then its read of round 1 found the slow peer's successes: it shared
    assert p1["shared"] == 1.0 and p1["rescued_prompts"] == 2.0


def test_lead_zero_waits_for_the_same_round_and_shares_past_the_deadline(
        pair: tuple[Side, Side], task: Task) -> None:
    fast, slow = pair
    probe = _probe(fast, task, lead=0)
    r0 = fast.round(task, 0)
    fast.publish(r0)
    thread, out = _plan_later(probe, r0)
    time.sleep(1.0)  # more than the probe's 0.3 s deadline
    slow.publish(slow.round(task, 0))
    thread.join(10.0)
    stats = out["plan"].stats
    assert stats["shared"] == 1.0 and stats["rescued_prompts"] == 2.0
    assert stats["lead_wait_s"] >= 0.9


def test_a_peer_that_never_publishes_costs_the_liveness_bound_and_says_so(
        pair: tuple[Side, Side], task: Task) -> None:
    fast, _ = pair
    probe = _probe(fast, task, lead=1, liveness=0.5)
    probe.peer_rounds = {"fast": 4, "slow": 4}
    waits = []
    for k in range(4):
        data = fast.round(task, k)
        fast.publish(data)
        stats = probe.plan(data).stats
        waits.append(stats.get("lead_timeout"))
        if k == 1:
            assert 0.5 <= stats["lead_wait_s"] < 5.0 and stats["shared"] == 0.0
    # round 0 has no round to keep pace with; round 1 waits the bound in vain; later rounds
    # do not wait for the peer that missed it
    assert waits == [None, 1.0, None, None] and probe.absent == {"slow"}


def test_a_trainer_asked_to_stop_leaves_the_wait_for_its_peers(
        pair: tuple[Side, Side], task: Task) -> None:
    fast, _ = pair
    probe = _probe(fast, task, lead=0, liveness=600.0)  # the peer never publishes
    stop = threading.Event()
    fast.ex.stop_requested = stop.is_set
    r0 = fast.round(task, 0)
    fast.publish(r0)
    thread, out = _plan_later(probe, r0)
    thread.join(1.0)
    assert thread.is_alive()  # held for the peer's round 0
    stop.set()  # SIGTERM: the round goes on without the peer, then the loop stops
    thread.join(10.0)
    assert not thread.is_alive()
    stats = out["plan"].stats
    assert stats["lead_timeout"] == 1.0 and stats["shared"] == 0.0
    assert 1.0 <= stats["lead_wait_s"] < 5.0


def test_no_bound_never_waits(pair: tuple[Side, Side], task: Task) -> None:
    fast, _ = pair
    probe = _probe(fast, task, lead=None)
    for k in range(3):
        data = fast.round(task, k)
        fast.publish(data)
        stats = probe.plan(data).stats
        assert "lead_wait_s" not in stats and stats["shared"] == 0.0


def test_a_peer_past_its_last_round_is_not_waited_for(pair: tuple[Side, Side],
                                                      task: Task) -> None:
    """The slow peer trains one round (its own `grpo.rounds`): the fast policy's later
    rounds do not wait for rounds it will never publish."""
    fast, slow = pair
    probe = _probe(fast, task, lead=0, liveness=30.0)
    probe.peer_rounds = {"fast": 3, "slow": 1}
    slow.publish(slow.round(task, 0))
    t0 = time.monotonic()
    for k in range(3):
        data = fast.round(task, k)
        fast.publish(data)
        stats = probe.plan(data).stats
        assert stats.get("lead_timeout", 0.0) == 0.0
    assert time.monotonic() - t0 < 10.0
