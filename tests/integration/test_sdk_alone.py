"""The SDK installs alone: proto + common + sdk from the local paths, under constraints.txt, into
a clean virtual environment, with no torch, transformers or redis, and its `mutualrl`
lists only the SDK's commands (the services and the trainer register theirs when installed)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "redis", "tokenizers", "fastapi")


def _run(*argv: str | Path, timeout: float = 480) -> str:
    result = subprocess.run([str(a) for a in argv], cwd=ROOT, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, (argv, result.stdout[-3000:], result.stderr[-3000:])
    return result.stdout


def test_sdk_alone_has_no_torch_and_only_its_commands(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)
    py, pip = venv / "bin" / "python", venv / "bin" / "pip"
    constraints = ROOT / "constraints.txt"
    # Built from copies: a non-editable build writes build/ folders into its source tree.
    src = tmp_path / "src"
    skip = shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    for pkg in ("proto", "services/common", "clients/python"):
        shutil.copytree(ROOT / pkg, src / pkg, ignore=skip)
    # setuptools first (the packages build with it, without build isolation: no extra fetch).
    _run(pip, "install", "-q", "-c", constraints, "setuptools>=75")
    _run(pip, "install", "-q", "--no-build-isolation", "-c", constraints,
         src / "proto", src / "services/common", src / "clients/python")

    installed = _run(py, "-c", "import importlib.util as u; "
                     f"print(','.join(m for m in {HEAVY!r} if u.find_spec(m)))").strip()
    assert installed == "", f"the SDK pulled {installed}"
    dists = _run(pip, "list", "--format=freeze").lower()
    assert {line.split("==")[0] for line in dists.splitlines()
            if line.startswith("mutualrl")} == {"mutualrl-proto", "mutualrl-common",
                                                 "mutualrl-sdk"}
    # Every SDK module imports in the clean environment.
    _run(py, "-c", "import mutualrl.client.see, mutualrl.client.thl, mutualrl.client.mwra, "
         "mutualrl.client.runs, mutualrl.client.local_worker, mutualrl.cli.inspect, "
         "mutualrl.cli.thl, mutualrl.common.alignment_wire")

    mutualrl = venv / "bin" / "mutualrl"
    top = _run(mutualrl, "--help")
    listed = set(re.findall(r"^    (\S+)", top, flags=re.MULTILINE))
    assert listed == {"health", "inspect", "thl", "token", "version"}, top
    thl = _run(mutualrl, "thl", "--help")
    assert "register" in thl and "list" in thl and "serve" not in thl
    assert "mutualrl-sdk 0.2.0" in _run(mutualrl, "version")
