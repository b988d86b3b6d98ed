"""The one id rule and the one key scheme (mutualrl.common.ids / keys)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mutualrl.common import ids
from mutualrl.common.errors import InvalidArgument
from mutualrl.common.keys import KeySpace


@pytest.mark.parametrize(("rule", "good", "bad"), [
    (ids.RUN_ID, ["r", "run-1", "a.b_c-9", "x" * 64],
     ["", "-r", ".", "..", "x" * 65, "a b", "a/b", "a{b}", "a:b", "é", "a*"]),
    (ids.NAME, ["p", "gpt2-bpe", "x" * 128], ["", "_p", "x" * 129, "a|b", "a/b", "a b"]),
    (ids.TOKENIZER_ID, ["org/model", "r1/gpt2-bpe", "x" * 128],
     ["", "/abs", "x" * 129, "a b", "a|b", "a:b"]),
    (ids.RECORD_KEY, ["a/1/p/0", "dataset id: 7", "é", "x" * 256, "-"],
     ["", "x" * 257, "a|b", "a\x01", "a\nb", "a\x7f"]),
])
def test_rules_accept_and_refuse(rule: ids.IdRule, good: list[str], bad: list[str]) -> None:
    for value in good:
        assert rule.check(value, "f") == value
    for value in bad:
        with pytest.raises(InvalidArgument) as err:
            rule.check(value, "config.run_id")
        assert err.value.field == "config.run_id"
        assert rule.kind in err.value.message


@given(st.text(max_size=300))
def test_sanitize_always_gives_a_valid_id(text: str) -> None:
    for rule in (ids.RUN_ID, ids.NAME, ids.TOKENIZER_ID):
        out = rule.sanitize(text)
        assert rule.valid(out), (rule.kind, text, out)
        if rule.valid(text):
            assert out == text


def test_key_scheme() -> None:
    ks = KeySpace("mrl", "see")
    assert ks.run_base("run42") == "mrl:see:{run42}:"
    assert ks.run_key("run42", "config") == "mrl:see:{run42}:config"
    assert ks.run_pattern("run42") == "mrl:see:{run42}:*"
    assert ks.index("runs") == "mrl:see:runs"
    with pytest.raises(InvalidArgument):
        ks.run_base("a}b")
    for prefix in ("", "a:b", "a*", "x" * 33):
        with pytest.raises(ValueError, match="key prefix"):
            KeySpace(prefix, "see")
    with pytest.raises(ValueError, match="service"):
        KeySpace("mrl", "trainer")


def test_every_service_config_takes_the_same_prefix_and_id_rules() -> None:
    from pydantic import ValidationError

    from mutualrl.mwra.config import MwraConfig
    from mutualrl.see.config import SeeConfig
    from mutualrl.thl.config import ThlConfig
    from mutualrl.trainer.config.run import TrainerConfig

    for model in (SeeConfig, ThlConfig, MwraConfig):
        assert model().key_prefix == "mrl"
        assert model(key_prefix="tst_1").key_prefix == "tst_1"
        with pytest.raises(ValidationError, match="key_prefix"):
            model(key_prefix="mutualrl:thl:")
    policies = [{"name": "a", "preset": "gpt2-bpe"}]
    with pytest.raises(ValidationError, match="run_id"):
        TrainerConfig.model_validate({"run_id": "../x", "policies": policies})
    with pytest.raises(ValidationError, match=r"policies\.0\.name"):
        TrainerConfig.model_validate({"policies": [{"name": "a b", "preset": "gpt2-bpe"}]})
    with pytest.raises(ValidationError, match="tokenizer id"):  # <run>/<name> over 128
        TrainerConfig.model_validate({"run_id": "r" * 64,
                                      "policies": [{"name": "n" * 70, "preset": "gpt2-bpe"}]})
