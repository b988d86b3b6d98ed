"""Dependencies point one way (the import-linter contracts in pyproject.toml):
proto <- common <- {see, thl, mwra, sdk}; trainer -> sdk (+ THL's engine); launcher -> all;
nothing imports the CLI from below; the SDK needs no torch, transformers or redis; the
trainer's math (`trainer.algos`) imports no network code.

The second test plants violations in a temporary copy of two packages and checks that they
are reported, so the first cannot pass by checking nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = str(Path(sys.executable).with_name("lint-imports"))


def _lint(env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LINT, "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_dependencies_point_one_way() -> None:
    result = _lint()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_planted_violations_are_reported(tmp_path: Path) -> None:
    ext = tmp_path / "ext" / "mutualrl"
    shutil.copytree(ROOT / "services/common/src/mutualrl/common", ext / "common")
    shutil.copytree(ROOT / "clients/python/src/mutualrl/client", ext / "client")
    (ext / "common" / "planted.py").write_text("import mutualrl.cli\n")
    (ext / "client" / "planted.py").write_text("import torch\n")
    # First on the path: `mutualrl.common` and `mutualrl.client` resolve to the copies.
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "ext")}
    result = _lint(env)
    assert result.returncode != 0, result.stdout[-4000:]
    out = result.stdout
    assert "common imports only proto BROKEN" in out
    assert "mutualrl.common.planted -> mutualrl.cli" in out
    assert "needs no torch, transformers or redis BROKEN" in out
    assert "mutualrl.client.planted -> torch" in out
