"""What crosses between policies is the problem and the completion text: over a real SEE (real
Redis) and THL in-process, a receiver whose chat template differs from the sender's builds its
SGT demonstrations and PRP rows on its own rendering of the prompt, token by token, with the
sender's completion retokenized into its tokens."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from chat_policies import chat_policy, write_problems
from service_loop import RolloutSample as Sample
from service_loop import see_server

from mutualrl.trainer.config.run import GRPOSettings, ProbeSettings
from mutualrl.trainer.config.task import DatasetTaskConfig
from mutualrl.trainer.data.chat import PromptRenderer, messages_of
from mutualrl.trainer.data.dataset_task import DatasetTask
from mutualrl.trainer.engines.base import completion_offsets
from mutualrl.trainer.runtime.presets import load_policy
from mutualrl.trainer.runtime.step import round_rows
from mutualrl.trainer.sharing.exchange import PeerExchange, round_records
from mutualrl.trainer.sharing.probes import RoundData, make_probe
from mutualrl.v1 import experience_pb2 as pb


@pytest.fixture(scope="module")
def see_address(redis_url: str) -> Iterator[str]:
    with see_server(redis_url, "chat") as address:
        yield address


def _sample(tok: Any, prompt_ids: list[int], text: str) -> Sample:
    ids = list(tok(text, add_special_tokens=False)["input_ids"])
    decoded, offsets = completion_offsets(tok, ids)
    assert decoded == text
    return Sample(ids, text, offsets, [-0.3] * len(ids), "stop", prompt_ids)


def test_sgt_demos_and_prp_rows_sit_on_the_receivers_rendering(see_address: str,
                                                               tmp_path: Path) -> None:
    run_id = f"chat-{uuid.uuid4().hex[:8]}"
    dirs = {"A": chat_policy("gpt2-bpe", tmp_path / "presets", tmp_path / "A"),
            "B": chat_policy("llama-char", tmp_path / "presets", tmp_path / "B")}
    tok = {k: load_policy(d)[1] for k, d in dirs.items()}
    render = {k: PromptRenderer(t, k) for k, t in tok.items()}
    task = DatasetTask(DatasetTaskConfig.model_validate({
        "dataset": {"path": str(write_problems(tmp_path / "t.parquet", 4)),
                    "prompt_key": "query", "answer_key": "gold"},
        "system": "Answer with the sum."}))
    prompts = task.round_prompts(0, 2, seed=0)
    ex = {k: PeerExchange(run_id, k, f"{run_id}/{k}", see_address, None, tok[k])
          for k in "AB"}
    paths = {f"{run_id}/{k}": str(d) for k, d in dirs.items()}
    try:
        for e in ex.values():
            e.join(["A", "B"], paths)
        # A solves both prompts on ITS rendering; B fails both on its own.
        samples_a = [[_sample(tok["A"], render["A"].ids(p), f"{p.answer}")] * 2
                     for p in prompts]
        scored_a = task.score(prompts, samples_a, tau=1.0)
        assert scored_a.correct == [[True, True]] * 2
        records = round_records(run_id, "A", 0, 0, f"{run_id}/A", prompts, samples_a,
                                scored_a.rewards, scored_a.correct, 1.0, None,
                                success=scored_a.success,
                                renderings=[render["A"].text(p) for p in prompts])
        # The problem crosses, not A's rendering.
        assert {r.prompt_text for r in records} == {p.text for p in prompts}
        assert all("<|im_start|>" not in r.prompt_text for r in records)
        assert {r.meta["rendered_prompt"] for r in records if r.kind == pb.ROLLOUT} == {
            render["A"].text(p) for p in prompts}
        assert all("rendered_prompt" not in r.meta for r in records if r.kind != pb.ROLLOUT)
        assert ex["A"].publish(records)
        b_ids = [render["B"].ids(p) for p in prompts]
        samples_b = [[_sample(tok["B"], b_ids[i], "0")] * 2 for i in range(2)]
        scored_b = task.score(prompts, samples_b, tau=1.0)
        assert ex["B"].publish(round_records(
            run_id, "B", 0, 0, f"{run_id}/B", prompts, samples_b, scored_b.rewards,
            scored_b.correct, 1.0, None, success=scored_b.success))
        data = RoundData(round=0, prompts=prompts, samples=samples_b,
                         rewards=torch.tensor(scored_b.rewards), correct=scored_b.correct,
                         success=torch.tensor(scored_b.success), peers_now=["A", "B"])

        want_prompt = [list(tok["B"].apply_chat_template(
            messages_of(p), add_generation_prompt=True, tokenize=True, return_dict=False))
            for p in prompts]
        assert want_prompt == b_ids and b_ids[0] != render["A"].ids(prompts[0])
        for kind in ("sgt", "prp"):
            plan = make_probe(ProbeSettings(kind=kind, deadline_seconds=5.0, prp_weight_mode=
                                            "none"), "B", ex["B"], task=task).plan(data)
            rows, _ = round_rows(b_ids, data, plan, GRPOSettings(group_size=2,
                                                                prompts_per_round=2))
            extra = range(4, len(rows))  # after B's own 2 x 2 samples
            assert len(extra) == 4 if kind == "prp" else len(extra) == 2, kind
            for i in extra:
                p = next(j for j, ids in enumerate(b_ids) if list(rows.prompts[i]) == ids)
                assert list(rows.prompts[i]) == want_prompt[p]  # B's rendering, token by token
                want = tok["B"](prompts[p].answer, add_special_tokens=False)["input_ids"]
                assert list(rows.completions[i]) == list(want)  # A's text in B's tokens
    finally:
        for e in ex.values():
            e.close()
        from mutualrl.client.runs import delete_run

        delete_run(run_id, see=see_address)
