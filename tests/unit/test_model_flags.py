"""Command-line flags derived from config models by pydantic-settings' CLI source
(mutualrl.common.flags): every field gets one, with its type, choices and docstring, nested
fields dotted; a scalar of the wrong type is an argparse error naming the flag; `mutualrl sft`
takes SFTConfig's fields this way and keeps its earlier short flags."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, Field

from mutualrl.cli import build_parser
from mutualrl.common.config import Config
from mutualrl.common.flags import add_model_flags, flag_values


class Inner(Config):
    mode: Literal["a", "b"] = "a"
    """How."""
    names: list[str] = Field(default_factory=list)
    """Which."""


class Outer(Config):
    steps: int = 1
    """How many steps (100% of them)."""
    path: Path | None = None
    """Where."""
    verbose: bool = True
    """Talk."""
    inner: Inner = Inner()
    """Nested."""
    table: dict[str, int] = Field(default_factory=dict)
    """As JSON."""


def _parser(model: type[BaseModel], **kw: object) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_model_flags(parser, model, **kw)  # type: ignore[arg-type]
    return parser


def test_flags_follow_the_fields_and_nest() -> None:
    p = _parser(Outer, aliases={"inner.mode": ["--mode"]})
    args = p.parse_args(["--steps", "4", "--path", "x/y", "--no-verbose", "--mode", "b",
                         "--inner.names", "p,q,r", "--table", '{"a": 1}'])
    got = flag_values(args, Outer)
    assert got == {"steps": "4", "path": "x/y", "verbose": False,
                   "inner": {"mode": "b", "names": ["p", "q", "r"]}, "table": {"a": 1}}
    assert Outer.model_validate(got) == Outer(steps=4, path=Path("x/y"), verbose=False,
                                              inner=Inner(mode="b", names=["p", "q", "r"]),
                                              table={"a": 1})
    assert flag_values(p.parse_args([]), Outer) == {}
    assert "How many steps (100% of them)." in " ".join(p.format_help().split())
    with pytest.raises(SystemExit):
        p.parse_args(["--inner.mode", "c"])
    with pytest.raises(SystemExit):
        p.parse_args(["--steps", "four"])
    with pytest.raises(SystemExit) as exit_info:  # read when the values are loaded
        flag_values(p.parse_args(["--table", "{a: 1"]), Outer)
    assert exit_info.value.code == 2


def test_a_bad_flag_value_is_an_argparse_error_naming_the_flag(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["see", "serve", "--port", "abc"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--port" in err and "valid integer" in err


def test_sft_flags_are_sftconfig_fields_and_the_old_names_still_work() -> None:
    from mutualrl.trainer.config.sft import SFTConfig

    args = build_parser().parse_args(
        ["sft", "--preset", "llama-char", "--regime", "worked", "--steps", "25", "--lr", "3e-3",
         "--out", "o", "--strong", "add,sub", "--no-progress", "--task.heldout-seed", "5",
         "--warmup", "3"])
    got = flag_values(args, SFTConfig)
    assert got == {"preset": "llama-char", "steps": "25", "lr": "3e-3", "out_dir": "o",
                   "strong_skills": ["add", "sub"], "progress": False, "warmup": "3",
                   "task": {"regime": "worked", "heldout_seed": "5"}}
    cfg = SFTConfig.model_validate(got)
    assert (cfg.steps, cfg.lr, cfg.out_dir, cfg.task.heldout_seed) == (25, 3e-3, Path("o"), 5)
    assert cfg.task.regime == "worked" and cfg.task.skills == SFTConfig().task.skills
    derived = {f"--{n.replace('_', '-')}" for n in SFTConfig.model_fields if n != "task"}
    sub = build_parser()
    with pytest.raises(SystemExit):
        sub.parse_args(["sft", "--no-such-flag", "1"])
    text = _sft_help()
    for flag in derived:
        assert flag in text, flag


def _sft_help() -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        build_parser().parse_args(["sft", "--help"])
    return out.getvalue()


def test_serve_flags_are_the_service_config_fields() -> None:
    from mutualrl.common.config import load_section
    from mutualrl.mwra.config import MwraConfig
    from mutualrl.see.config import SeeConfig

    args = build_parser().parse_args(["mwra", "serve", "--strategy", "time-share", "--port", "0",
                                      "--tick-seconds", "0.1", "--replica-id", "r1"])
    got = flag_values(args, MwraConfig)
    assert got == {"strategy": "time-share", "port": "0", "tick_seconds": "0.1",
                   "replica_id": "r1"}
    assert load_section(None, "mwra", MwraConfig, environ={}, **got).tick_seconds == 0.1
    with pytest.raises(SystemExit):
        build_parser().parse_args(["mwra", "serve", "--strategy", "fastest"])
    see = build_parser().parse_args(["see", "serve", "--workers", "2", "--rest-port", "0"])
    assert flag_values(see, SeeConfig) == {"workers": "2", "rest_port": "0"}
    nested = build_parser().parse_args(["see", "serve", "--limits.max-tokens", "64"])
    assert load_section(None, "see", SeeConfig, environ={},
                        **flag_values(nested, SeeConfig)).limits.max_tokens == 64
