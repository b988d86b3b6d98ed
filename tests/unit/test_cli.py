import subprocess
import sys

import pytest

from mutualrl.cli import main


def test_version_prints_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    import mutualrl

    assert main(["version"]) == 0
    assert capsys.readouterr().out.startswith(f"mutualrl {mutualrl.__version__}")


def test_help_lists_commands() -> None:
    out = subprocess.run([sys.executable, "-m", "mutualrl.cli", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "version" in out and "health" in out


def test_unknown_command_exits_with_usage_error() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code == 2
