"""Dependencies point one way (the import-linter contracts in pyproject.toml):
proto <- common <- {see, thl, mwra, sdk}; trainer -> sdk (+ THL's engine); launcher -> all;
nothing imports the CLI from below; the SDK needs no torch, transformers or redis; the
trainer's math (`trainer.algos`) imports no network code; the trainer is in layers (cli ->
runtime -> sharing -> data -> engines -> model -> config -> algos), its config a leaf.

The planted tests put violations in a temporary copy of a package and check that they are
reported, so the first cannot pass by checking nothing. The graph test builds the import graph
of every package with grimp (what import-linter runs on) and finds no cycle among a package's
modules, imports inside functions and under TYPE_CHECKING included."""

from __future__ import annotations

import graphlib
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = str(Path(sys.executable).with_name("lint-imports"))


ROOT_PACKAGES: list[str] = tomllib.loads((ROOT / "pyproject.toml").read_text())[
    "tool"]["importlinter"]["root_packages"]


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


def test_an_upward_import_breaks_the_trainer_layers(tmp_path: Path) -> None:
    ext = tmp_path / "ext" / "mutualrl"
    shutil.copytree(ROOT / "services/trainer/src/mutualrl/trainer", ext / "trainer",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (ext / "trainer" / "config" / "planted.py").write_text(
        "from mutualrl.trainer.runtime import session\n")
    (ext / "trainer" / "engines" / "planted.py").write_text(
        "def late() -> None:\n    from mutualrl.trainer.data import tasks\n")
    (ext / "trainer" / "extra").mkdir()
    (ext / "trainer" / "extra" / "__init__.py").write_text("")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "ext")}
    result = _lint(env)
    assert result.returncode != 0, result.stdout[-4000:]
    out = result.stdout
    assert "the trainer in layers: each imports only the layers below it BROKEN" in out
    assert "mutualrl.trainer.config.planted -> mutualrl.trainer.runtime.session" in out
    # an import inside a function counts as much as one at the top
    assert "mutualrl.trainer.engines.planted -> mutualrl.trainer.data.tasks" in out
    # a subpackage that takes no place among the layers is reported too
    assert "mutualrl.trainer.extra" in out
    # and the leaf: config's new import pulls torch in through the runtime
    assert "the trainer's config is a leaf" in out and "needs no torch or model" in out


def _first_cycle(deps: dict[str, set[str]]) -> list[str] | None:
    try:
        graphlib.TopologicalSorter(deps).prepare()
    except graphlib.CycleError as err:
        return list(err.args[1])
    return None


def _cycle(graph: grimp.ImportGraph, root: str) -> list[str] | None:
    """One import cycle under `root`, if any: among its modules, or among the children of one
    of its packages (a child package counts with everything under it, so `a.x -> b.y` and
    `b.z -> a.w` are the cycle `a -> b -> a`)."""
    modules = graph.find_descendants(root) | {root}
    cycle = _first_cycle({m: graph.find_modules_directly_imported_by(m) & modules
                          for m in modules})
    if cycle is not None:
        return cycle
    for package in sorted(modules):
        children = graph.find_children(package)
        members = {c: graph.find_descendants(c) | {c} for c in children}
        imported = {c: set().union(*(graph.find_modules_directly_imported_by(m)
                                     for m in members[c])) for c in children}
        cycle = _first_cycle({c: {d for d in children if d != c and imported[c] & members[d]}
                              for c in children})
        if cycle is not None:
            return cycle
    return None


@pytest.fixture(scope="module")
def import_graph() -> grimp.ImportGraph:
    return grimp.build_graph(*ROOT_PACKAGES, include_external_packages=False)


KNOWN_CYCLES = {
    "mutualrl.see": "rest (app) and dashboard (api) import each other",
    "mutualrl.launch": "report and up import each other",
}


@pytest.mark.parametrize("package", [
    pytest.param(p, marks=pytest.mark.xfail(reason=KNOWN_CYCLES[p], strict=True))
    if p in KNOWN_CYCLES else p for p in ROOT_PACKAGES])
def test_no_import_cycle_in_a_package(import_graph: grimp.ImportGraph, package: str) -> None:
    assert _cycle(import_graph, package) is None


def test_a_planted_cycle_is_found(import_graph: grimp.ImportGraph) -> None:
    import copy

    graph = copy.deepcopy(import_graph)
    graph.add_import(importer="mutualrl.trainer.config.run",
                     imported="mutualrl.trainer.runtime.loop")
    cycle = _cycle(graph, "mutualrl.trainer")
    assert cycle is not None
    assert "mutualrl.trainer.config.run" in cycle and "mutualrl.trainer.runtime.loop" in cycle
    # between two subpackages: runtime.loop imports sharing.probes, which now imports runtime
    graph = copy.deepcopy(import_graph)
    graph.add_import(importer="mutualrl.trainer.sharing.probes.none",
                     imported="mutualrl.trainer.runtime.determinism")
    assert set(_cycle(graph, "mutualrl.trainer") or []) == {"mutualrl.trainer.sharing",
                                                             "mutualrl.trainer.runtime"}
