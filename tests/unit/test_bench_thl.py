"""`mutualrl bench thl` on a small corpus: the JSON carries the figures the issue asks for, the
corpus respects the token range, and every float32 trace conserved its mass exactly."""

from __future__ import annotations

import json
from pathlib import Path

from mutualrl.cli import main


def test_bench_thl_small_corpus(tmp_path: Path) -> None:
    out = tmp_path / "thl.json"
    assert main(["bench", "thl", "--json", str(out), "--texts", "40", "--repeats", "1",
                 "--batch", "16"]) == 0
    result = json.loads(out.read_text())
    assert result["texts"] == 40 and result["batch"] == 16
    assert result["source_tokens_per_text"]["min"] >= 200
    assert result["source_tokens_per_text"]["max"] <= 800
    assert result["source_tokenizer"] == "byte_bpe" and result["target_tokenizer"] == "wordpiece"
    for key in ("ours_tokens_per_s", "spacy_alignments_tokens_per_s",
                "ours_per_item_tokens_per_s"):
        assert result[key] > 0
    expected = result["ours_tokens_per_s"] / result["spacy_alignments_tokens_per_s"]
    assert abs(result["ratio"] - expected) < 1e-9 * expected
    assert result["items_with_inexact_mass"] == 0
