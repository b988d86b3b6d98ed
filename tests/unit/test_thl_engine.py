"""THL engine and registry in-process: registration rules, persistence in a state dir, the LRU,
retokenization options, and input validation (errors name the field)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mutualrl.bench.testing.thl import trained_tokenizers
from mutualrl.common.alignment_types import TraceItem
from mutualrl.common.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from mutualrl.thl.engine import AlignmentEngine, EngineLimits
from mutualrl.thl.registry import JsonFileStore, TokenizerRegistry
from mutualrl.thl.residual import edit_distance, uncovered_bytes


@pytest.fixture(scope="module")
def paths() -> dict[str, str]:
    return trained_tokenizers()


@pytest.fixture(scope="module")
def eng(paths: dict[str, str]) -> AlignmentEngine:
    e = AlignmentEngine(limits=EngineLimits(max_batch=4, max_text_bytes=1000))
    for name, path in paths.items():
        e.register(name, path)
    return e


def test_register_reports_tokenizer_kinds(eng: AlignmentEngine) -> None:
    infos = {i.tokenizer_id: i for i in eng.list()}
    assert [i for i in infos] == sorted(infos)
    assert (infos["byte_bpe"].model_type, infos["byte_bpe"].byte_level) == ("BPE", True)
    assert (infos["wordpiece"].model_type, infos["wordpiece"].normalizer) == ("WordPiece",
                                                                              "BertNormalizer")
    assert (infos["unigram"].model_type, infos["unigram"].normalizer) == ("Unigram", "NFKC")
    assert infos["char"].model_type == "WordLevel" and not infos["char"].byte_level
    assert infos["byte_bpe"].vocab_size == 400


def test_tokenizer_json_file_and_registration_rules(paths: dict[str, str],
                                                    tmp_path: Path) -> None:
    e = AlignmentEngine()
    file = Path(paths["char"]) / "tokenizer.json"
    info = e.register("c", str(file))
    assert info.model_type == "WordLevel" and info.path == str(file.resolve())
    assert e.register("c", str(file)) == info  # same path again: idempotent
    with pytest.raises(AlreadyExists, match="overwrite"):
        e.register("c", paths["byte_bpe"])
    assert e.register("c", paths["byte_bpe"], overwrite=True).model_type == "BPE"
    with pytest.raises(InvalidArgument, match="does not exist"):
        e.register("x", str(tmp_path / "missing"))
    with pytest.raises(InvalidArgument, match="tokenizer_id"):
        e.register("bad id!", paths["char"])
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(InvalidArgument, match=r"not a tokenizer\.json"):
        e.register("x", str(tmp_path / "notes.txt"))
    with pytest.raises(NotFound, match="no tokenizer registered as 'nope'"):
        e.retokenize("nope", ["a"])


def test_slow_tokenizer_is_refused(tmp_path: Path) -> None:
    # ByT5 has only a Python ("slow") tokenizer: AutoTokenizer returns is_fast == False.
    slow = tmp_path / "byt5"
    slow.mkdir()
    (slow / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "ByT5Tokenizer"}))
    e = AlignmentEngine()
    with pytest.raises(InvalidArgument, match=r"slow \(Python\) tokenizer; THL needs a fast"):
        e.register("byt5", str(slow))
    assert e.list() == []


def test_registrations_survive_restart_in_state_dir(paths: dict[str, str],
                                                   tmp_path: Path) -> None:
    first = AlignmentEngine(TokenizerRegistry(JsonFileStore(tmp_path)))
    first.register("a", paths["byte_bpe"])
    first.register("b", paths["wordpiece"])
    expected = first.retokenize("b", ["Hello world"])[0]
    restarted = AlignmentEngine(TokenizerRegistry(JsonFileStore(tmp_path)))
    assert [i.tokenizer_id for i in restarted.list()] == ["a", "b"]
    again = restarted.retokenize("b", ["Hello world"])[0]
    assert again.token_ids.tolist() == expected.token_ids.tolist()
    assert restarted.registry.loads == 1  # loaded lazily from the persisted path


def test_lru_cache_evicts_and_reloads(paths: dict[str, str], tmp_path: Path) -> None:
    reg = TokenizerRegistry(cache_size=2)
    for name in ("byte_bpe", "wordpiece", "char"):
        reg.register(name, paths[name])
    assert reg.cached_ids() == ["wordpiece", "char"]
    reg.get("byte_bpe")
    assert reg.loads == 1 and reg.cached_ids() == ["char", "byte_bpe"]
    reg.get("char")
    assert reg.loads == 1 and reg.cached_ids() == ["byte_bpe", "char"]


def test_special_tokens_and_chat_template(paths: dict[str, str], tmp_path: Path,
                                          eng: AlignmentEngine) -> None:
    plain = eng.retokenize("byte_bpe_special", ["hi"], add_special_tokens=False)[0]
    full = eng.retokenize("byte_bpe_special", ["hi"], add_special_tokens=True)[0]
    assert full.token_ids.tolist() == [1, *plain.token_ids.tolist(), 2]
    assert full.offsets[0].tolist() == [0, 0] and full.offsets[-1].tolist() == [0, 0]
    assert full.residual.roundtrip_mismatch_chars == 0  # added specials are not text
    with pytest.raises(FailedPrecondition, match="no chat template"):
        eng.retokenize("byte_bpe", ["hi"], apply_chat_template=True)
    templated = tmp_path / "chat"
    shutil.copytree(paths["byte_bpe"], templated)
    cfg_path = templated / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    cfg_path.write_text(json.dumps(cfg))
    e = AlignmentEngine()
    e.register("chat", str(templated))
    out = e.retokenize("chat", ["2+2=4"], apply_chat_template=True)[0]
    assert out.text == "<|user|>2+2=4\n"
    starts, ends = out.offsets[:, 0], out.offsets[:, 1]
    assert "".join(out.text[a:b] for a, b in zip(starts, ends, strict=True)) == out.text


def test_normalising_tokenizer_aligns_on_original_text(eng: AlignmentEngine) -> None:
    text = "Hello WORLD ﬁne"
    src = eng.retokenize("byte_bpe", [text])[0]
    out = eng.align_trace("byte_bpe", "wordpiece", [TraceItem(text, src.token_ids,
                                                              np.zeros(len(src.token_ids)),
                                                              src.offsets)]).results[0]
    # Offsets point into the original (not lower-cased) text.
    pieces = [text[a:b] for a, b in out.target_offsets.tolist()]
    assert "Hello" in "".join(pieces) and "WORLD" in "".join(pieces)
    assert out.chunks.char_end[-1] == len(text)
    # Lower-casing changes 6 letters and NFKC-like folding of the ligature is not done by
    # BertNormalizer; the metric is the edit distance to the normaliser's output.
    normalized = eng.registry.get("wordpiece").backend.normalizer.normalize_str(text)
    assert out.residual.normalized_changed_chars == edit_distance(text, normalized) >= 6
    uni = eng.retokenize("unigram", ["ﬁne"])[0]
    assert uni.residual.normalized_changed_chars == 2  # NFKC: "ﬁ" -> "fi"


def test_align_without_offsets_reencodes_and_checks_ids(eng: AlignmentEngine) -> None:
    text = "the quick 日本 fox"
    src = eng.retokenize("unigram", [text])[0]
    vals = -np.arange(len(src.token_ids), dtype=np.float64)
    with_off = eng.align_trace("unigram", "char", [TraceItem(text, src.token_ids, vals,
                                                             src.offsets)])
    without = eng.align_trace("unigram", "char", [TraceItem(text, src.token_ids, vals)])
    assert (with_off.results[0].target_values.tolist()
            == without.results[0].target_values.tolist())
    wrong = src.token_ids.copy()
    wrong[0] = (wrong[0] + 1) % 50 + 4
    with pytest.raises(InvalidArgument, match=r"items\[0\].source_token_ids"):
        eng.align_trace("unigram", "char", [TraceItem(text, wrong, vals)])


@pytest.mark.parametrize(("item", "field", "message"), [
    (TraceItem("ab", [5, 6], [0.0]), r"items\[0\]\.values", "1 values for 2 source tokens"),
    (TraceItem("ab", [5, 6], [0.0, 0.0], [[0, 1]]), r"items\[0\]\.source_offsets", "shape"),
    (TraceItem("ab", [5, 6], [0.0, 0.0], [[0, 1], [1, 3]]), r"items\[0\]\.source_offsets",
     "outside"),
    (TraceItem("ab", [5, 6], [0.0, float("nan")], [[0, 1], [1, 2]]), r"items\[0\]\.values",
     "finite"),
    (TraceItem("ab", [5, 10**6], [0.0, 0.0], [[0, 1], [1, 2]]),
     r"items\[0\]\.source_token_ids", r"\[0, 400\)"),
    (TraceItem("x" * 1001, [], []), r"items\[0\]\.text", "over the 1000-byte limit"),
    (TraceItem("a\ud800b", [], []), r"items\[0\]\.text", "not valid Unicode"),
])
def test_align_trace_rejects_bad_items(eng: AlignmentEngine, item: TraceItem, field: str,
                                       message: str) -> None:
    with pytest.raises(InvalidArgument, match=f"{field}: .*{message}"):
        eng.align_trace("byte_bpe", "char", [item])


def test_batch_mode_and_id_limits(eng: AlignmentEngine) -> None:
    with pytest.raises(InvalidArgument, match="items: 5 entries, over the limit of 4"):
        eng.align_trace("byte_bpe", "char", [TraceItem("", [], [])] * 5)
    with pytest.raises(InvalidArgument, match="mode"):
        eng.align_trace("byte_bpe", "char", [], mode="token")  # type: ignore[arg-type]
    with pytest.raises(NotFound, match="target_tokenizer_id"):
        eng.align_trace("byte_bpe", "missing", [])
    with pytest.raises(InvalidArgument, match="texts: 5 entries"):
        eng.retokenize("char", ["a"] * 5)
    empty = eng.align_trace("byte_bpe", "char", [TraceItem("", [], [])])
    assert len(empty.results[0].chunks) == 1 and empty.results[0].target_values.size == 0


def test_batch_residual_aggregates_items(eng: AlignmentEngine) -> None:
    texts = ["Hello World", "abc", "日本 🎉"]
    items = []
    for t in texts:
        enc = eng.retokenize("byte_bpe", [t])[0]
        items.append(TraceItem(t, enc.token_ids, np.zeros(len(enc.token_ids)), enc.offsets))
    out = eng.align_trace("byte_bpe", "wordpiece", items)
    per = [r.residual for r in out.results]
    assert out.residual.normalized_changed_chars == sum(r.normalized_changed_chars for r in per)
    assert out.residual.roundtrip_mismatch_chars == sum(r.roundtrip_mismatch_chars for r in per)
    n = [len(r.target_token_ids) for r in out.results]
    assert out.residual.multi_token_chunk_share == pytest.approx(
        sum(r.multi_token_chunk_share * k for r, k in zip(per, n, strict=True)) / sum(n))


def test_residual_helpers() -> None:
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("", "abc") == 3 and edit_distance("same", "same") == 0
    # Long texts with scattered changes (lower-casing) stay exact and fast.
    long = "Hello World. " * 500
    assert edit_distance(long, long.lower()) == 1000
    assert uncovered_bytes("a日b", np.array([0]), np.array([1])) == 4
    assert uncovered_bytes("a日b", np.array([0, 1, 2]), np.array([1, 2, 3])) == 0


def test_edit_distance_matches_dynamic_programming() -> None:
    rng = np.random.default_rng(3)

    def dp(a: str, b: str) -> int:
        prev = list(range(len(b) + 1))
        for i, ca in enumerate(a, 1):
            cur = [i]
            for j, cb in enumerate(b, 1):
                cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
            prev = cur
        return prev[-1]

    alphabet = list("abé日🎉 ")
    for _ in range(300):
        a = "".join(rng.choice(alphabet, size=rng.integers(0, 40)))
        b = "".join(rng.choice(alphabet, size=rng.integers(0, 40)))
        assert edit_distance(a, b) == dp(a, b)


def test_engine_and_clients_share_one_interface() -> None:
    import inspect

    from mutualrl.client.thl import AsyncThlClient, ThlClient

    for name in ("register", "list", "retokenize", "align_trace", "delete_run"):
        ref = inspect.signature(getattr(AlignmentEngine, name))
        for cls in (ThlClient, AsyncThlClient):
            sig = inspect.signature(getattr(cls, name))
            assert list(sig.parameters) == list(ref.parameters), (cls.__name__, name)
            assert [p.default for p in sig.parameters.values()] == [
                p.default for p in ref.parameters.values()], (cls.__name__, name)
            assert sig.return_annotation == ref.return_annotation, (cls.__name__, name)
