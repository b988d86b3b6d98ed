"""avg@n and the unbiased pass@k: the estimator against brute force over every k-subset, and
pass@k >= avg@n, per policy and per skill."""

from __future__ import annotations

from itertools import combinations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mutualrl.trainer.evaluation import BenchmarkSettings, default_ks, pass_at_k, summarize


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
