"""Every rollout engine checks a `generate` call's arguments the same way before it samples
(`engines.base.check_request`): a clear ValueError naming the argument, and no call for no
prompts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mutualrl.trainer.engines.base import check_request


@pytest.mark.parametrize(("args", "message"), [
    ({"n": 0}, "n and max_new_tokens must be >= 1"),
    ({"max_new_tokens": 0}, "n and max_new_tokens must be >= 1"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_k": -1}, "top_k must be >= 0"),
    ({"min_p": 1.5}, r"min_p must be in \[0, 1\]"),
    ({"seeds": [1, 2, 3]}, "seeds: one per prompt"),
])
def test_a_bad_argument_is_named(args: dict[str, Any], message: str) -> None:
    call = {"prompts": ["a", "b"], "n": 2, "max_new_tokens": 4, "seeds": None, "top_p": 1.0,
            "top_k": 0, "min_p": 0.0} | args
    with pytest.raises(ValueError, match=message):
        check_request(**call)
    check_request(**(call | {k: v for k, v in
                             {"n": 2, "max_new_tokens": 4, "seeds": [1, 2], "top_p": 0.5,
                              "top_k": 3, "min_p": 0.1}.items() if k in args}))


def test_the_hf_engine_checks_before_it_samples(tmp_path: Path) -> None:
    """Catches an engine that samples with an argument out of range (planted: HFEngine's
    `generate` without `check_request`: a zero-sample call answers instead of raising)."""
    from mutualrl.trainer.engines.hf import HFEngine
    from mutualrl.trainer.runtime.presets import ensure_preset, load_policy

    model, tok = load_policy(ensure_preset("llama-char", tmp_path / "presets"))
    engine = HFEngine(model, tok)
    assert engine.generate([], n=1, max_new_tokens=2) == []
    with pytest.raises(ValueError, match="n and max_new_tokens"):
        engine.generate(["1+1="], n=0, max_new_tokens=2)
    with pytest.raises(ValueError, match="seeds: one per prompt"):
        engine.generate(["1+1="], n=1, max_new_tokens=2, seeds=[1, 2])
    assert len(engine.generate(["1+1="], n=2, max_new_tokens=2, seeds=[7])[0]) == 2
