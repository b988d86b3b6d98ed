"""#14 item 12, THL in-process: every cache and request size has a configured bound. The
tokenizer cache by count and by bytes, the registry by registrations and by runs per
registration, tokenizers by size, and a call by its total text, its source tokens and the
response it could make (AlignTrace is refused up front like Retokenize)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mutualrl.bench.testing.thl import trained_tokenizers
from mutualrl.common import alignment_wire as wire
from mutualrl.common.alignment_types import TraceItem
from mutualrl.common.errors import InvalidArgument, ResourceExhausted
from mutualrl.thl.engine import AlignmentEngine, EngineLimits, align_response_bound
from mutualrl.thl.registry import RegistryLimits, TokenizerRegistry


@pytest.fixture(scope="module")
def paths() -> dict[str, str]:
    return trained_tokenizers()


def _size(path: str) -> int:
    return (Path(path) / "tokenizer.json").stat().st_size


def test_cache_keeps_at_most_its_bytes(paths: dict[str, str]) -> None:
    probe = TokenizerRegistry()
    sizes = {n: probe.register(n, paths[n]) and probe.get(n).nbytes
             for n in ("byte_bpe", "wordpiece", "char")}
    assert min(sizes.values()) > 1000
    budget = sum(sizes.values()) - min(sizes.values()) + 1  # two fit, never three
    reg = TokenizerRegistry(cache_size=16, limits=RegistryLimits(cache_max_bytes=budget))
    for i in range(9):
        name = ("byte_bpe", "wordpiece", "char")[i % 3]
        reg.register(f"t{i}", paths[name])
        assert 0 < reg.cached_bytes <= budget
        assert len(reg.cached_ids()) <= 2
    assert reg.cached_ids()[-1] == "t8"
    # a tokenizer alone over the budget is still kept (the one in use)
    tight = TokenizerRegistry(limits=RegistryLimits(cache_max_bytes=1))
    tight.register("a", paths["char"])
    tight.register("b", paths["byte_bpe"])
    assert tight.cached_ids() == ["b"] and tight.cached_bytes == tight.get("b").nbytes


def test_registrations_and_runs_are_capped(paths: dict[str, str]) -> None:
    reg = TokenizerRegistry(limits=RegistryLimits(max_tokenizers=3, max_runs_per_tokenizer=2))
    for i in range(3):
        reg.register(f"t{i}", paths["char"], run_id="r1")
    with pytest.raises(ResourceExhausted) as err:
        reg.register("t3", paths["char"])
    assert err.value.field == "tokenizer_id" and "thl.max_tokenizers" in err.value.message
    reg.register("t0", paths["char"])  # an id already held is no new registration
    reg.register("t0", paths["char"], run_id="r2")
    with pytest.raises(ResourceExhausted) as err:
        reg.register("t0", paths["char"], run_id="r3")
    assert err.value.field == "run_id"
    reg.register("t0", paths["char"], run_id="r2")  # a run already holding it: fine
    assert reg.delete_run("r1") == 3  # t1, t2 dropped: room again
    reg.register("t3", paths["char"])
    assert [i.tokenizer_id for i in reg.list()] == ["t0", "t3"]


def test_tokenizer_over_its_size_limit_is_refused(paths: dict[str, str], tmp_path: Path) -> None:
    size = _size(paths["byte_bpe"])
    reg = TokenizerRegistry(limits=RegistryLimits(max_tokenizer_bytes=size - 1))
    for path in (paths["byte_bpe"], str(Path(paths["byte_bpe"]) / "tokenizer.json")):
        with pytest.raises(InvalidArgument) as err:
            reg.register("big", path)
        assert err.value.field == "path" and "thl.max_tokenizer_bytes" in err.value.message
    assert reg.list() == [] and reg.cached_ids() == []
    TokenizerRegistry(limits=RegistryLimits(max_tokenizer_bytes=size)).register(
        "big", paths["byte_bpe"])


@pytest.fixture(scope="module")
def eng(paths: dict[str, str]) -> AlignmentEngine:
    e = AlignmentEngine(limits=EngineLimits(max_request_text_bytes=100_000,
                                            max_response_bytes=2_000_000))
    e.register("bpe", paths["byte_bpe"])
    e.register("wp", paths["wordpiece"])
    return e


def test_total_text_per_call_is_capped(eng: AlignmentEngine) -> None:
    texts = ["the quick brown fox " * 500] * 11  # 110 kB in all, each text within its limit
    with pytest.raises(InvalidArgument) as err:
        eng.retokenize("bpe", texts)
    assert err.value.field == "texts" and "100000 per call" in err.value.message
    with pytest.raises(InvalidArgument) as err:
        eng.align_trace("bpe", "wp", [TraceItem(t, [], []) for t in texts])
    assert err.value.field == "items"
    assert len(eng.retokenize("bpe", texts[:10])) == 10


def test_source_tokens_beyond_what_a_text_can_have_are_refused(eng: AlignmentEngine) -> None:
    n = 4 * 3 + 16 + 1  # "abc": at most 4 per byte + the special-token slack
    item = TraceItem("abc", np.zeros(n, dtype=np.int64), np.zeros(n))
    with pytest.raises(InvalidArgument) as err:
        eng.align_trace("bpe", "wp", [item])
    assert err.value.field == "items[0].source_token_ids"


def test_align_trace_too_large_to_answer_is_refused_before_the_work(
        paths: dict[str, str]) -> None:
    e = AlignmentEngine(limits=EngineLimits(max_response_bytes=1_000_000))
    e.register("bpe", paths["byte_bpe"])
    e.register("wp", paths["wordpiece"])
    text = "the quick brown fox jumps over 42 lazy dogs. " * 2000  # 90 kB
    items = [TraceItem(text, [], []) for _ in range(8)]
    loads = e.registry.loads
    with pytest.raises(ResourceExhausted) as err:
        e.align_trace("bpe", "wp", items)
    assert err.value.field == "items" and "1000000-byte message limit" in err.value.message
    assert e.registry.loads == loads
    # what fits is answered, and the bound holds for the real answer, worst cases included
    worst = ["é" * 300, "🎉" * 200, "a b" * 300, "", "x", "日本語 " * 50, "  \n\t " * 40]
    for texts in ([text[:3000]] * 4, worst):
        src = e.retokenize("bpe", texts)
        for with_offsets in (True, False):
            items = [TraceItem(t, r.token_ids, np.full(len(r.token_ids), -0.5),
                               r.offsets if with_offsets else None)
                     for t, r in zip(texts, src, strict=True)]
            m = [len(r.token_ids) for r in e.retokenize("wp", texts)]
            for mode, placement in (("chunk", "last"), ("sequence", "spread")):
                res = e.align_trace("bpe", "wp", items, mode, placement)  # type: ignore[arg-type]
                size = len(wire.result_bytes(res))
                assert size <= align_response_bound(
                    texts, [len(it.source_token_ids) for it in items], m, 400), (texts[0][:10],
                                                                                mode)
            for a, t, it in zip(res.results, texts, items, strict=True):
                assert len(a.chunks) <= max(1, min(len(t), len(it.source_token_ids) + len(
                    a.target_token_ids) + 1))
