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


def _lint_planted(tmp_path: Path, packages: dict[str, str], plants: dict[str, str]) -> str:
    """lint-imports over copies of `packages` (name -> source folder) with `plants` (path
    under the copies -> text) added; the copies come first on the path, so `mutualrl.<name>`
    resolves to them. Returns the report, which must be a failure."""
    ext = tmp_path / "ext" / "mutualrl"
    for name, folder in packages.items():
        shutil.copytree(ROOT / folder, ext / name, ignore=shutil.ignore_patterns("__pycache__"))
    for path, text in plants.items():
        (ext / path).parent.mkdir(parents=True, exist_ok=True)
        (ext / path).write_text(text)
    result = _lint({**os.environ, "PYTHONPATH": str(tmp_path / "ext")})
    assert result.returncode != 0, result.stdout[-4000:]
    return result.stdout


def test_planted_violations_are_reported(tmp_path: Path) -> None:
    out = _lint_planted(
        tmp_path, {"common": "services/common/src/mutualrl/common",
                   "client": "clients/python/src/mutualrl/client"},
        {"common/planted.py": "import mutualrl.cli\n", "client/planted.py": "import torch\n"})
    assert "common imports only proto BROKEN" in out
    assert "mutualrl.common.planted -> mutualrl.cli" in out
    assert "needs no torch, transformers or redis BROKEN" in out
    assert "mutualrl.client.planted -> torch" in out


def test_an_upward_import_breaks_the_trainer_layers(tmp_path: Path) -> None:
    out = _lint_planted(
        tmp_path, {"trainer": "services/trainer/src/mutualrl/trainer"},
        {"trainer/config/planted.py": "from mutualrl.trainer.runtime import session\n",
         "trainer/engines/planted.py":
             "def late() -> None:\n    from mutualrl.trainer.data import tasks\n",
         "trainer/extra/__init__.py": ""})
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


@pytest.mark.parametrize("package", ROOT_PACKAGES)
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


# What the trainer still imports inside a function, each for its reason: an optional extra,
# or a dependency only some runs use that costs seconds to import. Everything else is imported
# at the top of its module (the command line's handler modules are loaded by name when their
# command runs, `mutualrl.trainer.cli.main._handler`, so `mutualrl --help` stays light).
LATE_IMPORTS = {
    "vllm": "optional extra: the vLLM engine, built when a policy selects it",
    "sglang": "optional extra (CUDA): the SGLang engine, built when a policy selects it",
    "wandb": "optional extra: metrics.wandb",
    "peft": "LoRA policies only; importing it takes seconds",
    "datasets": "table tasks (task.dataset) only; importing it takes seconds",
    "math_verify": "the math_verify reward only; it imports sympy",
    "torch.utils.tensorboard": "metrics.tensorboard only",
    "torch.distributed.fsdp": "data-parallel runs only (FSDP2); importing it takes a second",
    "torch.distributed.checkpoint": "data-parallel checkpoints (DCP) only",
    "torch.distributed.elastic": "the elastic launcher of data-parallel runs only",
    "torch.distributed.launcher": "the elastic launcher of data-parallel runs only",
    "torch.distributed.device_mesh": "HSDP runs only (a 2-D mesh over nodes and ranks)",
}


def _imports_inside_functions(root: Path) -> list[tuple[str, int, str]]:
    import ast

    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        stack: list[tuple[ast.AST, bool]] = [(tree, False)]
        while stack:
            node, in_fn = stack.pop()
            for child in ast.iter_child_nodes(node):
                if in_fn and isinstance(child, ast.Import | ast.ImportFrom):
                    names = ([child.module or ""] if isinstance(child, ast.ImportFrom)
                             else [a.name for a in child.names])
                    found += [(str(path.relative_to(ROOT)), child.lineno, n) for n in names]
                stack.append((child, in_fn or isinstance(
                    child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)))
    return found


def test_the_trainer_imports_inside_functions_only_for_a_reason() -> None:
    late = _imports_inside_functions(ROOT / "services/trainer/src/mutualrl/trainer")
    unexplained = [f"{path}:{line} {module}" for path, line, module in late
                   if not any(module == m or module.startswith(m + ".") for m in LATE_IMPORTS)]
    assert unexplained == []
    assert {m for _, _, m in late} >= {"vllm", "peft", "datasets"}  # the check sees them


def test_the_command_line_loads_neither_torch_nor_pydantic() -> None:
    code = ("import sys; from mutualrl.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'pydantic', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    assert out.strip() == "[]"
