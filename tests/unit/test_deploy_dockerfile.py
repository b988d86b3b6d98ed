"""deploy/dockerfile.py reads Dockerfiles and .dockerignore files the way BuildKit does.

validate-deploy's image checks stand on this model (no Docker engine runs them), so its rules are
pinned here on small Dockerfiles written for each case.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "deploy"))

from dockerfile import IgnoreFile, parse, parse_pip


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def context(tmp_path: Path) -> Path:
    for package in ("proto", "services/see"):
        write(tmp_path, f"{package}/pyproject.toml", "[project]\nname = 'x'\n")
    write(tmp_path, "constraints.txt", "numpy==2.0.0\n")
    return tmp_path


def test_copy_of_a_directory_copies_its_contents_and_files_keep_their_name(context: Path) -> None:
    dockerfile = write(context, "Dockerfile", (
        "FROM python:3.11 AS build\n"
        "WORKDIR /src\n"
        "COPY constraints.txt ./\n"
        "COPY proto ./proto\n"
        "COPY services/see proto /merged/\n"  # two directories: their contents, merged
    ))
    built = parse(dockerfile, context)
    stage = built.stages[0]
    assert stage.copies[0].entries == [("/src/constraints.txt", "constraints.txt", False)]
    assert built.context_path(stage, "/src/proto/pyproject.toml") == "proto/pyproject.toml"
    assert built.context_path(stage, "/merged/pyproject.toml") == "proto/pyproject.toml"  # last
    assert built.context_path(stage, "/merged/services/see") is None
    assert built.context_path(stage, "/src/services/see") is None


def test_missing_copy_source_is_reported(context: Path) -> None:
    dockerfile = write(context, "Dockerfile", "FROM scratch\nCOPY nowhere ./x\n")
    assert parse(dockerfile, context).stages[0].copies[0].missing == ["nowhere"]


def test_stages_targets_and_what_each_image_is_built_from(context: Path) -> None:
    dockerfile = write(context, "Dockerfile", (
        "ARG BASE=python:3.11\n"
        "FROM ${BASE} AS deps\n"
        "WORKDIR /src\n"
        "COPY proto ./proto\n"
        "FROM deps AS builder\n"  # inherits WORKDIR and files
        "RUN pip install -c /src/constraints.txt ./proto\n"
        "FROM ${BASE} AS runtime\n"
        "COPY --from=builder /opt/venv /opt/venv\n"
        'ENTRYPOINT ["tini", "--", "mutualrl"]\n'
        "FROM ${BASE} AS other\n"
    ))
    built = parse(dockerfile, context)
    assert [s.base for s in built.stages] == ["python:3.11", "deps", "python:3.11", "python:3.11"]
    assert [t.name for t in built.targets()] == ["runtime", "other"]
    runtime = built.stage("runtime")
    assert runtime is not None and runtime.entrypoint == ["tini", "--", "mutualrl"]
    assert [s.name for s in built.closure(runtime)] == ["deps", "builder", "runtime"]
    builder = built.stage("builder")
    assert builder is not None and builder.workdir == "/src"
    assert built.context_path(builder, "/src/proto") == "proto"
    assert builder.pips[0].paths == [("./proto", "/src/proto", ())]


def test_pip_installs_are_found_in_shell_chains_with_their_line(context: Path) -> None:
    dockerfile = write(context, "Dockerfile", (
        "FROM python:3.11\n"
        "WORKDIR /src\n"
        "# a comment line\n"
        "RUN --mount=type=cache,target=/root/.cache/pip \\\n"
        "    python -m venv /v && /v/bin/pip install --constraint=constraints.txt \\\n"
        "        ./proto './services/see[gpu,bench]' \\\n"
        " && python3 -m pip install -q -cconstraints.txt --no-deps \\\n"
        "        --index-url https://example.org/cpu torch ; echo done\n"
        "RUN pip3 --disable-pip-version-check install -r req.txt -e ./proto $(ls /w/*.whl)\n"
        "RUN pip download numpy && pip wheel .\n"
    ))
    first, second, third = parse(dockerfile, context).stages[0].pips
    assert (first.line, second.line, third.line) == (4, 4, 9)
    assert first.constraints == ["/src/constraints.txt"]
    assert first.paths == [("./proto", "/src/proto", ()),
                           ("./services/see[gpu,bench]", "/src/services/see", ("gpu", "bench"))]
    assert second.constraints == ["/src/constraints.txt"]
    assert second.no_deps and second.names == ["torch"]
    assert second.index_options == ["--index-url https://example.org/cpu"]
    assert third.requirement_files == ["req.txt"]
    assert third.editables == ["./proto"]
    assert third.unresolved == ["$(ls /w/*.whl)"]


def test_pip_argument_forms() -> None:
    pip = parse_pip(1, ["-c", "a.txt", "--constraint", "/b.txt", "six==1.0", "https://x/y.whl",
                        "pkg @ https://x/z.whl", "/abs/dir"], "/w")
    assert pip.constraints == ["/w/a.txt", "/b.txt"]
    assert pip.names == ["six==1.0"]
    assert pip.urls == ["https://x/y.whl", "pkg @ https://x/z.whl"]
    assert pip.paths == [("/abs/dir", "/abs/dir", ())]
    assert not pip.no_deps


def test_ignore_file_allow_list(tmp_path: Path) -> None:
    ignore = IgnoreFile.read(write(tmp_path, ".dockerignore", (
        "# allow-list\n*\n!constraints.txt\n!services/see\n**/__pycache__\n**/*.pyc\n"
        "!services/see/keep.pyc\n"
    )))
    assert ignore.admits("constraints.txt")
    assert ignore.admits("services/see/src/mutualrl/see/x.py")
    assert not ignore.admits("services/thl/pyproject.toml")  # `*` covers the whole `services`
    assert not ignore.admits(".env")
    assert not ignore.admits(".venv/bin/python")
    assert not ignore.admits("services/see/src/__pycache__/x.cpython-311.pyc")
    assert ignore.admits("services/see/keep.pyc")  # the last matching rule wins
    assert not ignore.admits("constraints.txt.bak")  # `!constraints.txt` is exact


def test_ignore_file_walk_prunes_excluded_trees(tmp_path: Path) -> None:
    for name in ("keep/a.py", "keep/sub/b.py", ".venv/lib/c.py", "other/d.py", "top.txt"):
        write(tmp_path, name, "")
    ignore = IgnoreFile.read(write(tmp_path, ".dockerignore", "*\n!keep\n!top.txt\n"))
    assert sorted(ignore.admitted_files(tmp_path)) == ["keep/a.py", "keep/sub/b.py", "top.txt"]
    assert ignore.may_admit_below("keep") and not ignore.may_admit_below(".venv")


def test_double_star_matches_any_depth_and_star_one_segment(tmp_path: Path) -> None:
    ignore = IgnoreFile.read(write(tmp_path, ".dockerignore", "**/build\ndocs/*.md\n"))
    assert not ignore.admits("build/x")
    assert not ignore.admits("services/see/build/lib/x.py")
    assert not ignore.admits("docs/a.md")
    assert ignore.admits("docs/sub/a.md")
    assert ignore.admits("services/see/builder.py")
