import os
import subprocess
import sys

import pytest

from mutualrl.cli import main


def test_version_prints_every_installed_package(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    assert main(["version"]) == 0
    out = capsys.readouterr().out.splitlines()
    for name in ("mutualrl-proto", "mutualrl-common", "mutualrl-sdk", "mutualrl-see",
                 "mutualrl-thl", "mutualrl-mwra", "mutualrl-trainer", "mutualrl-launcher",
                 "mutualrl-bench"):
        assert f"{name} {version(name)}" in out


def test_help_lists_commands() -> None:
    out = subprocess.run([sys.executable, "-m", "mutualrl.cli", "--help"], capture_output=True,
                         text=True, check=True).stdout
    # every package's entry point registered its commands
    for command in ("version", "health", "inspect", "see", "thl", "mwra", "train", "sft", "up",
                    "experiment", "bench"):
        assert f"    {command} " in out or f"    {command}\n" in out, command


def test_unknown_command_exits_with_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code == 2


def test_cli_turns_grpc_fork_support_off_unless_the_user_chose() -> None:
    # The supervisor forks children while its channels are busy; with fork support on, gRPC's
    # handlers abort or hang those children (tests/integration/test_supervisor.py).
    code = ("import os; from mutualrl.cli import main; main(['version']); "
            "print(os.environ['GRPC_ENABLE_FORK_SUPPORT'])")
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env).stdout
    assert out.splitlines()[-1] == "false"
    env["GRPC_ENABLE_FORK_SUPPORT"] = "true"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=env).stdout
    assert out.splitlines()[-1] == "true"


def test_token_prints_the_scoped_tokens_of_the_secret(capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from mutualrl.common.auth import Principal, Role, identify

    monkeypatch.setenv("MUTUALRL_AUTH_TOKEN", "s3cret")
    assert main(["token", "policy", "team.a"]) == 0
    token = capsys.readouterr().out.strip()
    assert identify(f"Bearer {token}", "s3cret") == Principal(Role.POLICY, "team.a")
    assert main(["token", "read"]) == 0
    assert identify(f"Bearer {capsys.readouterr().out.strip()}", "s3cret") == \
        Principal(Role.READ)
    assert main(["token", "policy"]) == 2
    monkeypatch.delenv("MUTUALRL_AUTH_TOKEN")
    assert main(["token", "read"]) == 2
