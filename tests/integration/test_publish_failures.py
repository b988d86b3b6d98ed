"""The asynchronous mode's publish failures, against a real SEE that refuses a trainer's
rounds: SEE takes at most 4 records a Publish (`limits.max_batch_records`), so a round of two
prompts (8 records) is refused with INVALID_ARGUMENT and a round of one prompt (4) is stored.
A failed publish returns False and counts; a good one resets the count; the
`exchange.max_failed_publishes`-th failure in a row ends the run with PublishError naming the
setting and SEE's reason."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoTokenizer

from mutualrl.bench.testing.see import make_config, running_see
from mutualrl.bench.testing.thl import trained_tokenizers
from mutualrl.client.see import SeeClient
from mutualrl.trainer.data.tasks import Prompt
from mutualrl.trainer.engines.base import Sample
from mutualrl.trainer.sharing.exchange import PeerExchange, PublishError, round_records

pytestmark = pytest.mark.timeout(120)

POLICIES = ("A", "B")


def _round(run_id: str, k: int, prompts: int) -> list[object]:
    """Round `k` of policy A: `prompts` prompts of two samples, the first one solving it."""
    ps = [Prompt(id=f"q{k}-{i}", skill="add", text=f"{i}+1=", answer=str(i + 1))
          for i in range(prompts)]
    samples = [[Sample(0, [5, 6], text, [(0, len(text)), (len(text), len(text))], [-0.5, -0.5],
                       "stop") for text in (p.answer, "no")] for p in ps]
    return round_records(run_id, "A", k, k, f"{run_id}/A", ps, samples,
                         [[1.0, 0.0] for _ in ps], [[True, False] for _ in ps], 1.0)


def _publishes(see: str, run_id: str) -> dict[str, object]:
    tok = AutoTokenizer.from_pretrained(trained_tokenizers()["char"])
    ex = PeerExchange(run_id, "A", f"{run_id}/A", see, None, tok, timeout=10, tau=1.0,
                      outage_budget=0, reads_within_deadline=True, max_failed_publishes=3)
    results: list[bool] = []
    failures: list[int] = []
    got: dict[str, object] = {"results": results, "failures": failures}
    try:
        ex.join(POLICIES, {})
        assert len(_round(run_id, 0, 2)) == 8 and len(_round(run_id, 0, 1)) == 4
        for k, prompts in enumerate((2, 2, 1, 2, 2)):
            results.append(ex.publish(_round(run_id, k, prompts)))
            failures.append(ex.publish_failures)
        got["published"] = ex.published
        with pytest.raises(PublishError) as stop:
            ex.publish(_round(run_id, 5, 2))
        got["error"] = str(stop.value)
    finally:
        ex.close()
    with SeeClient(see) as client:
        answer = client.round_stats(run_id, 2, ["q2-0"])
        got["stats_of_round_2"] = [[p.policy_id for p in x.policies] for x in answer.prompts]
    return got


async def test_failed_publishes_count_reset_on_a_good_one_and_stop_at_the_limit(
        redis_url: str, run_id: str) -> None:
    """Catches a failure that is not counted or not reported (planted: `publish` returning
    True after a refusal), a good publish that leaves the count standing (planted: `_send`
    without `self.publish_failures = 0`: PublishError at round 3, "2 publishes in a row" never
    reached) and a stop one failure late (planted: `>` for `>=` in `_failed`: no PublishError
    at the third failure in a row)."""
    async with running_see(make_config(redis_url, limits={"max_batch_records": 4})) as see:
        got = await asyncio.to_thread(_publishes, see.address, run_id)
    assert got["results"] == [False, False, True, False, False], got
    assert got["failures"] == [1, 2, 0, 1, 2], got
    assert got["published"] == 4, got  # the good round only
    error = str(got["error"])
    assert "policy 'A': 3 publishes in a row failed (exchange.max_failed_publishes=3)" in error
    assert "INVALID_ARGUMENT" in error and "4" in error, error  # SEE's reason, its limit
    assert got["stats_of_round_2"] == [["A"]], got  # SEE holds what the good publish sent
