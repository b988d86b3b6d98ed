"""A test's own deadlines end it before pytest's timeout does: pytest-timeout kills a test at
its `timeout` mark (the module's `pytestmark`, else pyproject's `timeout`) without the log tail
the test's own deadline would print (`run_up`'s, a subprocess's `timeout=`, a wait loop's
`time.monotonic() + N`). So every e2e and integration test whose own deadlines add up past the
default carries a mark above their sum.

The sum is read from the source: every literal `timeout=<seconds>` keyword and
`time.monotonic() + <seconds>` in the test, in the module's functions it calls and in the
module's fixtures it takes (a call inside a loop counted once)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIERS = ("e2e",)


def _number(node: ast.expr) -> float | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) \
            and not isinstance(node.value, bool):
        return float(node.value)
    return None


def _timeout_mark(node: ast.expr) -> float | None:
    """N of a `pytest.mark.timeout(N)` in `node` (a mark, or a list of marks)."""
    for sub in ast.walk(node):
        if (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute)
                and sub.func.attr == "timeout" and sub.args):
            return _number(sub.args[0])
    return None


class Module:
    """One test module's functions, marks and deadlines."""

    def __init__(self, path: Path, default: float) -> None:
        self.path = path
        tree = ast.parse(path.read_text(encoding="utf-8"))
        self.functions = {f.name: f for f in tree.body
                          if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
        self.default = default
        for stmt in tree.body:
            if (isinstance(stmt, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets)):
                self.default = _timeout_mark(stmt.value) or default

    def own(self, name: str, seen: frozenset[str] = frozenset()) -> float:
        """Seconds of deadline in function `name` and what it calls of this module."""
        fn = self.functions[name]
        total = 0.0
        for node in ast.walk(fn):
            if isinstance(node, ast.keyword) and node.arg == "timeout":
                total += _number(node.value) or 0.0
            elif (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)
                  and isinstance(node.left, ast.Call) and isinstance(node.left.func, ast.Attribute)
                  and node.left.func.attr == "monotonic"):
                total += _number(node.right) or 0.0
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in self.functions and node.func.id not in seen | {name}):
                total += self.own(node.func.id, seen | {name})
        for arg in fn.args.args:  # fixtures of this module the test takes
            if arg.arg in self.functions and arg.arg not in seen | {name}:
                total += self.own(arg.arg, seen | {name})
        return total

    def limit(self, name: str) -> float:
        """The test's pytest-timeout: its own mark, else the module's, else the default."""
        for deco in self.functions[name].decorator_list:
            mark = _timeout_mark(deco)
            if mark is not None:
                return mark
        return self.default

    def tests(self) -> list[str]:
        return [n for n in self.functions if n.startswith("test_")]


def default_timeout() -> float:
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    return float(ini["timeout"])


def overruns(paths: list[Path], default: float) -> list[str]:
    """`file::test: own N s > timeout M s` for every test pytest would kill first."""
    out = []
    for path in paths:
        module = Module(path, default)
        for name in module.tests():
            own, limit = module.own(name), module.limit(name)
            if own >= limit:
                out.append(f"{path.relative_to(ROOT)}::{name}: its own deadlines add to "
                           f"{own:g} s, its pytest timeout is {limit:g} s")
    return out


def test_every_slow_test_outlives_its_own_deadlines() -> None:
    """Catches a test whose own deadlines pytest's timeout cuts short (planted: the
    `pytest.mark.timeout` of tests/e2e/test_up_outages.py removed: "its own deadlines add to
    ... s, its pytest timeout is 300 s")."""
    paths = sorted(p for tier in TIERS for p in (ROOT / "tests" / tier).glob("test_*.py"))
    assert len(paths) > 10
    bad = overruns(paths, default_timeout())
    assert not bad, "add or raise a pytest.mark.timeout:\n" + "\n".join(bad)


def test_the_reading_finds_deadlines_marks_and_helpers(tmp_path: Path) -> None:
    """The reader itself: a subprocess's timeout, a wait loop's deadline, a helper called and
    a fixture taken count; a test's own mark wins over the module's."""
    path = tmp_path / "test_x.py"
    path.write_text(
        "import subprocess, time\nimport pytest\n"
        "pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]\n"
        "@pytest.fixture\ndef served():\n    subprocess.run(['x'], timeout=100)\n"
        "def _up():\n    return subprocess.run(['up'], timeout=250)\n"
        "def test_a(served):\n    deadline = time.monotonic() + 30\n    _up()\n"
        "@pytest.mark.timeout(900)\ndef test_b():\n    _up(); _up(); _up()\n"
        "def test_c():\n    _up()\n")
    module = Module(path, 300.0)
    assert [module.own(t) for t in ("test_a", "test_b", "test_c")] == [380.0, 750.0, 250.0]
    assert [module.limit(t) for t in ("test_a", "test_b", "test_c")] == [400.0, 900.0, 400.0]
    assert overruns([path], 300.0) == []
    path.write_text(path.read_text().replace("timeout(400)", "timeout(300)"))
    with pytest.raises(ValueError):  # (outside ROOT: the message's relative path)
        overruns([path], 300.0)
    module = Module(path, 300.0)
    assert [t for t in module.tests() if module.own(t) >= module.limit(t)] == ["test_a"]
