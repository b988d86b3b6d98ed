"""Stop tokens in shared experience, over a real SEE (real Redis) and THL in-process, on a JSONL
task whose only stop is EOS: records finish with EOS, SGT demonstrations and PRP rows end with
the receiver's own EOS, and PRP's sender and receiver sums cover the same text and stop."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from service_loop import RolloutSample as Sample
from service_loop import see_server

from mutualrl.trainer.config.run import ProbeSettings
from mutualrl.trainer.config.task import JsonlTaskConfig
from mutualrl.trainer.data.task_factory import make_task
from mutualrl.trainer.engines.base import completion_offsets
from mutualrl.trainer.runtime.presets import ensure_preset, load_policy
from mutualrl.trainer.sharing.exchange import PeerExchange, round_records
from mutualrl.trainer.sharing.probes import RoundData, make_probe


@pytest.fixture(scope="module")
def see_address(redis_url: str) -> Iterator[str]:
    with see_server(redis_url, "stop") as address:
        yield address


@pytest.fixture(scope="module")
def jsonl_task(tmp_path_factory: pytest.TempPathFactory) -> Any:
    path = tmp_path_factory.mktemp("task") / "train.jsonl"
    rows = [{"id": f"q{i}", "question": f"{i}+{i}=", "answer": f"#### {2 * i}"}
            for i in range(1, 5)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    task = make_task(JsonlTaskConfig(path=path, heldout_fraction=0.0, fallback_last_number=True))
    assert task.stop == []  # generation stops at EOS only
    return task


def _sample(tok: Any, prompt: str, text: str, eos: bool, base: float) -> Sample:
    ids = list(tok(text, add_special_tokens=False)["input_ids"]) + (
        [tok.eos_token_id] if eos else [])
    decoded, offsets = completion_offsets(tok, ids)
    assert decoded == text
    logprobs = [base - 0.1 * j for j in range(len(ids))]
    return Sample(ids, text, offsets, logprobs, "stop", list(tok(prompt)["input_ids"]))


def test_eos_travels_with_sgt_demos_and_prp_rows(see_address: str, jsonl_task: Any,
                                                 tmp_path: Path) -> None:
    run_id = f"stop-{uuid.uuid4().hex[:8]}"
    (_, tok_a) = load_policy(ensure_preset("gpt2-bpe", tmp_path))
    (_, tok_b) = load_policy(ensure_preset("llama-char", tmp_path))
    # Different EOS ids (A: 1, B: 2), so appending the sender's id would be caught.
    tok_a.eos_token_id = 1
    paths = {f"{run_id}/A": str(ensure_preset("gpt2-bpe", tmp_path)),
             f"{run_id}/B": str(ensure_preset("llama-char", tmp_path))}
    ex_a = PeerExchange(run_id, "A", f"{run_id}/A", see_address, None, tok_a)
    ex_b = PeerExchange(run_id, "B", f"{run_id}/B", see_address, None, tok_b)
    try:
        ex_a.join(["A", "B"], paths)
        ex_b.join(["A", "B"], paths)
        prompts = jsonl_task.prompts("train")[:2]
        # A answers both prompts; "=N" stops at EOS, "+N" by a (virtual) stop string.
        samples_a = [[_sample(tok_a, p.text, f"{'=+'[g]}{p.answer}", eos=(g == 0), base=-0.5)
                      for g in range(2)] for p in prompts]
        rewards_a = [[jsonl_task.reward(p, s.text, s.finish_reason) for s in row]
                     for p, row in zip(prompts, samples_a, strict=True)]
        correct_a = [[jsonl_task.is_correct(p, s.text, s.finish_reason) for s in row]
                     for p, row in zip(prompts, samples_a, strict=True)]
        assert rewards_a == [[1.0, 1.0], [1.0, 1.0]]
        records = round_records(run_id, "A", 0, 0, f"{run_id}/A", prompts, samples_a, rewards_a,
                                correct_a, 1.0, tok_a.eos_token_id)
        from mutualrl.v1 import experience_pb2 as pb

        rollouts = [r for r in records if r.kind == pb.ROLLOUT]
        assert [r.finish_reason for r in rollouts] == [pb.FINISH_REASON_EOS,
                                                       pb.FINISH_REASON_STOP] * 2
        assert ex_a.publish(records)
        # B fails both prompts.
        samples_b = [[_sample(tok_b, p.text, "0", eos=True, base=-1.0) for _ in range(2)]
                     for p in prompts]
        rewards = torch.zeros(2, 2)
        assert ex_b.publish(round_records(
            run_id, "B", 0, 0, f"{run_id}/B", prompts, samples_b, rewards.tolist(),
            [[False] * 2] * 2, 1.0, tok_b.eos_token_id))
        data = RoundData(round=0, prompts=prompts, samples=samples_b, rewards=rewards,
                         correct=[[False] * 2] * 2, peers_now=["A", "B"])

        # SGT: the success that stopped by EOS ends with B's EOS, the other one does not.
        sgt = make_probe(ProbeSettings(kind="sgt", deadline_seconds=5.0), "B", ex_b,
                         task=jsonl_task).plan(data)
        assert sgt.demos is not None and len(sgt.demos) == 4
        got = {(i, tuple(ids)) for ids, i in zip(sgt.demos.token_ids, sgt.demos.prompt_index,
                                                 strict=True)}
        want = {(i, tuple(ex_b.retokenize([f"{c}{p.answer}"])[0] + ([2] if c == "=" else [])))
                for i, p in enumerate(prompts) for c in "=+"}
        assert got == want

        # PRP, chunk level: the EOS is a chunk of its own, B's EOS against A's log p(EOS).
        prp = make_probe(ProbeSettings(kind="prp", prp_level="chunk", deadline_seconds=5.0),
                         "B", ex_b).plan(data)
        peers = prp.peers
        assert peers is not None and len(peers.token_ids) == 4
        assert peers.token_chunk is not None and peers.chunk_sender_logp is not None
        by_text_eos = {(p.id, g == 0): s for p, row in zip(prompts, samples_a, strict=True)
                       for g, s in enumerate(row)}
        seen = set()
        for i, ids in enumerate(peers.token_ids):
            chunks, send = peers.token_chunk[i], peers.chunk_sender_logp[i]
            pid = prompts[peers.prompt_index[i]].id
            ends = ids[-1] == 2
            sender = by_text_eos[(pid, ends)]
            seen.add((pid, ends))
            text_ids = ids[:-1] if ends else ids
            assert tok_b.decode(text_ids) == sender.text  # the same text on both sides
            assert float(peers.sender_logp_sum[i]) == pytest.approx(sum(sender.logprobs))
            assert sum(send) == pytest.approx(sum(sender.logprobs))
            if ends:
                assert chunks[-1] == len(send) - 1 and chunks[-2] == len(send) - 2
                assert send[-1] == pytest.approx(sender.logprobs[-1])
            else:
                assert tok_a.eos_token_id not in sender.token_ids
        assert len(seen) == 4
    finally:
        ex_a.close()
        ex_b.close()
        from mutualrl.client.runs import delete_run

        delete_run(run_id, see=see_address)


def test_sgt_self_demos_end_with_eos_where_own_successes_did(see_address: str, jsonl_task: Any,
                                                             tmp_path: Path) -> None:
    """sgt-self, SGT's control, keeps the stop of its own successes as SGT keeps the peers'."""
    from mutualrl.trainer.sharing.probes.sgt import SGTSelfProbe

    run_id = f"stop-{uuid.uuid4().hex[:8]}"
    (_, tok_a) = load_policy(ensure_preset("gpt2-bpe", tmp_path))
    (_, tok_b) = load_policy(ensure_preset("llama-char", tmp_path))
    paths = {f"{run_id}/A": str(ensure_preset("gpt2-bpe", tmp_path)),
             f"{run_id}/B": str(ensure_preset("llama-char", tmp_path))}
    ex_a = PeerExchange(run_id, "A", f"{run_id}/A", see_address, None, tok_a)
    ex_b = PeerExchange(run_id, "B", f"{run_id}/B", see_address, None, tok_b)
    try:
        ex_a.join(["A", "B"], paths)
        ex_b.join(["A", "B"], paths)
        prompts = jsonl_task.prompts("train")[:2]
        probe = make_probe(ProbeSettings(kind="sgt-self", deadline_seconds=5.0), "B", ex_b,
                           task=jsonl_task)
        assert isinstance(probe, SGTSelfProbe)
        # Round 0: B solves both prompts, "=N" stopping at EOS, "+N" by a stop string.
        own = [[_sample(tok_b, p.text, f"{'=+'[g]}{p.answer}", eos=(g == 0), base=-1.0)
                for g in range(2)] for p in prompts]
        ones = torch.ones(2, 2)
        a_ok = [[_sample(tok_a, p.text, f"={p.answer}", eos=True, base=-0.5)] * 2
                for p in prompts]
        for k in (0, 1):  # A solves both prompts in rounds 0 and 1
            assert ex_a.publish(round_records(run_id, "A", k, k, f"{run_id}/A", prompts, a_ok,
                                              ones.tolist(), [[True] * 2] * 2, 1.0,
                                              tok_a.eos_token_id))
        assert ex_b.publish(round_records(run_id, "B", 0, 0, f"{run_id}/B", prompts, own,
                                          ones.tolist(), [[True] * 2] * 2, 1.0,
                                          tok_b.eos_token_id))
        probe.plan(RoundData(round=0, prompts=prompts, samples=own, rewards=ones,
                             correct=[[True] * 2] * 2, peers_now=["A", "B"]))
        # Round 1: B fails both; A solved them, so SGT would rescue both: sgt-self draws B's own.
        fail = [[_sample(tok_b, p.text, "0", eos=True, base=-1.0)] * 2 for p in prompts]
        assert ex_b.publish(round_records(run_id, "B", 1, 1, f"{run_id}/B", prompts, fail,
                                          torch.zeros(2, 2).tolist(), [[False] * 2] * 2, 1.0,
                                          tok_b.eos_token_id))
        plan = probe.plan(RoundData(round=1, prompts=prompts, samples=fail,
                                    rewards=torch.zeros(2, 2), correct=[[False] * 2] * 2,
                                    peers_now=["A", "B"]))
        assert plan.demos is not None and len(plan.demos) >= 1
        texts = {f"{c}{p.answer}" for p in prompts for c in "=+"}
        for ids in plan.demos.token_ids:
            ends = ids[-1] == tok_b.eos_token_id
            text = tok_b.decode(ids[:-1] if ends else ids)
            assert text in texts
            assert ends == text.startswith("=")
    finally:
        ex_a.close()
        ex_b.close()
        from mutualrl.client.runs import delete_run

        delete_run(run_id, see=see_address)
