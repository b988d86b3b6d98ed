from pathlib import Path

import pytest
from pydantic import ValidationError

from mutualrl.common.auth import (
    POLICY_HEADER,
    acting_for,
    bearer_metadata,
    derive_token,
    token_matches,
)
from mutualrl.common.channel import ClientOptions
from mutualrl.common.config import ServiceConfig, load_section


def test_token_matches_only_exact_bearer() -> None:
    assert token_matches("Bearer s3cret", "s3cret")
    assert token_matches("bearer s3cret", "s3cret")
    assert not token_matches("Bearer s3cre", "s3cret")
    assert not token_matches("Basic s3cret", "s3cret")
    assert not token_matches("", "s3cret")
    assert not token_matches(None, "s3cret")
    assert bearer_metadata("x") == (("authorization", "Bearer x"),)
    assert bearer_metadata(None) == ()


def test_a_policy_tokens_calls_name_its_policy() -> None:
    """Every client call with a policy token carries the policy in its metadata; an explicit
    policy (or "" for none) is sent as given, and read back by the same module."""
    token = derive_token("s3cret", "policy:team.a")
    sent = bearer_metadata(token)
    assert sent == (("authorization", f"Bearer {token}"), (POLICY_HEADER, "team.a"))
    assert acting_for(sent) == "team.a"
    assert acting_for(bearer_metadata(token, "b")) == "b"
    assert acting_for(bearer_metadata(token, "")) is None
    assert acting_for(bearer_metadata(derive_token("s3cret", "read"))) is None
    assert acting_for(ClientOptions(token=token).metadata()) == "team.a"


def test_load_section_reads_one_section_and_overrides(tmp_path: Path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text("see:\n  port: 6000\n  host: 0.0.0.0\nother: {x: 1}\n")
    got = load_section(cfg, "see", ServiceConfig, port=7000, host=None)
    assert got.port == 7000 and got.host == "0.0.0.0"
    assert load_section(cfg, "missing", ServiceConfig).port == 0
    assert load_section(None, "see", ServiceConfig).host == "127.0.0.1"


def test_the_environment_sets_any_field_of_a_section_between_file_and_flags(
        tmp_path: Path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text("see:\n  port: 6000\n  host: 0.0.0.0\n")
    env = {"MUTUALRL_SEE__PORT": "6100", "MUTUALRL_SEE__GRACE_SECONDS": "1.5",
           "MUTUALRL_THL__PORT": "1", "MUTUALRL_SEE__HOST": ""}  # another section; empty: unset
    got = load_section(cfg, "see", ServiceConfig, environ=env)
    assert (got.port, got.grace_seconds, got.host) == (6100, 1.5, "0.0.0.0")
    assert load_section(cfg, "see", ServiceConfig, environ=env, port=7000).port == 7000
    with pytest.raises(ValidationError, match="port"):
        load_section(cfg, "see", ServiceConfig, environ={"MUTUALRL_SEE__PORT": "70000"})
    with pytest.raises(ValueError, match="MUTUALRL_SEE__PROT: the `see` section has no field"):
        load_section(cfg, "see", ServiceConfig, environ={"MUTUALRL_SEE__PROT": "1"})


def test_unknown_and_invalid_fields_are_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text("see:\n  prot: 6000\n")
    with pytest.raises(ValidationError, match="prot"):
        load_section(cfg, "see", ServiceConfig)
    cfg.write_text("see:\n  port: 70000\n")
    with pytest.raises(ValidationError, match="port"):
        load_section(cfg, "see", ServiceConfig)


def test_every_service_config_field_is_documented() -> None:
    for model in (ServiceConfig, ClientOptions):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"


def test_token_falls_back_to_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUTUALRL_AUTH_TOKEN", "from-env")
    assert ServiceConfig().resolved_token() == "from-env"
    assert ServiceConfig(auth_token="explicit").resolved_token() == "explicit"
    monkeypatch.delenv("MUTUALRL_AUTH_TOKEN")
    assert ServiceConfig().resolved_token() is None


def test_backoff_grows_and_is_capped() -> None:
    opts = ClientOptions(backoff_base=0.1, backoff_max=1.0)
    assert 0.075 <= opts.backoff(0) <= 0.125
    assert 0.3 <= opts.backoff(2) <= 0.5
    assert opts.backoff(10) <= 1.25
