"""deploy/docker/requirements.py: the third-party requirements the images install before the
packages' sources, followed through workspace packages and their extras."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "docker" / "requirements.py"


def requirements(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, check=False)


def package(root: Path, directory: str, text: str) -> None:
    (root / directory).mkdir(parents=True)
    (root / directory / "pyproject.toml").write_text(text, encoding="utf-8")


def test_workspace_requirements_and_extras_are_followed(tmp_path: Path) -> None:
    package(tmp_path, "base", '[project]\nname = "ws-base"\ndependencies = ["numpy>=1"]\n'
            '[project.optional-dependencies]\nredis = ["redis>=5"]\nunused = ["torch"]\n')
    package(tmp_path, "app", '[project]\nname = "ws_app"\n'
            'dependencies = ["ws-base[redis]==0.1", "pyyaml>=6; sys_platform != \'win32\'"]\n'
            '[project.optional-dependencies]\ngpu = ["sglang<1"]\n')
    out = requirements("./base", "./app[gpu]", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n") == ["numpy>=1", "pyyaml>=6; sys_platform != 'win32'",
                                      "redis>=5", "sglang<1", ""]


def test_the_service_image_gets_no_torch() -> None:
    out = requirements("./proto", "./services/common", "./clients/python", "./services/see",
                       "./services/thl", "./services/mwra")
    assert out.returncode == 0, out.stderr
    names = {line.split(">")[0].split("=")[0].split("<")[0] for line in out.stdout.split()}
    assert "grpcio" in names and "fastapi" in names
    assert not names & {"torch", "tensorboard", "peft"}
    assert not any(n.startswith("mutualrl") for n in names)


def test_an_unknown_extra_is_named(tmp_path: Path) -> None:
    package(tmp_path, "base", '[project]\nname = "ws-base"\ndependencies = []\n')
    out = requirements("./base[nope]", cwd=tmp_path)
    assert out.returncode != 0
    assert "ws-base has no extra 'nope'" in out.stderr
