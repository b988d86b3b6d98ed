"""avg@n and the unbiased pass@k: the estimator against brute force over every k-subset, and
pass@k >= avg@n, per policy and per skill."""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mutualrl.trainer.config.run import BenchmarkSettings
from mutualrl.trainer.data.evaluation import default_ks, pass_at_k, summarize


@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n),
                                                     st.integers(1, n))))
def test_pass_at_k_is_the_share_of_k_subsets_with_a_success(nck: tuple[int, int, int]) -> None:
    n, c, k = nck
    samples = [1] * c + [0] * (n - c)
    subsets = list(combinations(range(n), k))
    brute = sum(any(samples[i] for i in s) for s in subsets) / len(subsets)
    assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)
    assert pass_at_k(n, c, 1) == pytest.approx(c / n)
    assert pass_at_k(n, c, k) >= c / n - 1e-12
    if k < n:
        assert pass_at_k(n, c, k + 1) >= pass_at_k(n, c, k) - 1e-12


@given(st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 4)), min_size=1, max_size=20))
def test_summary_per_skill(rows: list[tuple[str, int]]) -> None:
    skills, succ = [s for s, _ in rows], [c for _, c in rows]
    out = summarize("tiny", skills, succ, 4, [1, 2, 4])
    assert out["bench/tiny/avg@4"] == pytest.approx(sum(succ) / (4 * len(succ)))
    assert out["bench/tiny/pass@1"] == pytest.approx(out["bench/tiny/avg@4"])
    assert out["bench/tiny/pass@4"] >= out["bench/tiny/avg@4"] - 1e-12
    for s in set(skills) if len(set(skills)) > 1 else ():
        mine = [c for k, c in rows if k == s]
        assert out[f"bench/tiny/{s}/avg@4"] == pytest.approx(sum(mine) / (4 * len(mine)))


def test_settings() -> None:
    assert default_ks(8) == [1, 2, 4, 8] and default_ks(6) == [1, 2, 4, 6]
    with pytest.raises(ValueError, match=r"eval.benchmarks\[b\].k"):
        BenchmarkSettings(name="b", path="x.parquet", n=4, k=[8])
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_a_benchmark_samples_with_its_own_truncation(tmp_path) -> None:
    """`top_k: 1` reaches the engine: every one of a problem's n samples is the same
    completion, although the temperature is 1 and each sample has its own seed."""
    from chat_policies import write_problems

    from mutualrl.trainer.config.task import DatasetTaskConfig
    from mutualrl.trainer.data.chat import PromptRenderer
    from mutualrl.trainer.data.dataset_task import DatasetTask
    from mutualrl.trainer.data.evaluation import run_benchmark
    from mutualrl.trainer.engines.hf import HFEngine
    from mutualrl.trainer.runtime.distributed import SINGLE
    from mutualrl.trainer.runtime.presets import ensure_preset, load_policy

    class Kept(HFEngine):
        """The real engine, keeping what it sampled."""

        def generate(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            self.kept = super().generate(*args, **kwargs)
            return self.kept

    model, tok = load_policy(ensure_preset("llama-char", tmp_path / "presets"))
    path = write_problems(tmp_path / "b.parquet", 3)
    task = DatasetTask(DatasetTaskConfig.model_validate(
        {"dataset": {"path": str(path), "prompt_key": "query", "answer_key": "gold"}}))
    engine = Kept(model, tok)
    for top_k, distinct in ((1, {1}), (0, None)):
        bench = BenchmarkSettings(name="b", path=path, n=4, temperature=1.0, top_k=top_k)
        got = run_benchmark(bench, task, PromptRenderer(tok, "p"), engine, SINGLE, 12, 1.0, 0)
        assert "bench/b/avg@4" in got
        sizes = {len({tuple(s.token_ids) for s in row}) for row in engine.kept}
        if distinct is not None:
            assert sizes == distinct
        else:  # untruncated sampling at T = 1 from a random model spreads
            assert max(sizes) > 1
    with pytest.raises(ValueError, match="top_p"):
        BenchmarkSettings(name="b", path="x.parquet", top_p=0.0)
