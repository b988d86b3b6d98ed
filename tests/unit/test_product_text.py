"""The product speaks of the product: README, docs, configs and docstrings never tell how it was
developed (work sessions and their machines, issue numbers, machines lent or not, what was tried
and dropped). That history lives in git. The deny-list is short on purpose: each pattern is a
phrase of development talk, not a word with a product meaning (a trainer `Session`, the
dashboard's `/v1/session` route and a server's host stay legitimate)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ORDINAL = (r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|earlier|"
           r"previous|later|next|last|this|that|another|other|each|every|one|two|several)")
DENY = [
    re.compile(r"\bissues?\s*#?\d+", re.I),
    re.compile(rf"\b{ORDINAL}\s+(?:work\s+)?sessions?\b(?!\s*(?:id|token|cookie|storage))", re.I),
    re.compile(r"\bsessions?(?:'s|')\s+(?:host|machine)", re.I),
    re.compile(r"\bacross\s+sessions\b", re.I),
    re.compile(r"\b(?:this|that|the\s+earlier|the\s+previous|an?\s+earlier)\s+host\b", re.I),
    re.compile(r"\b(?:was|were|is|not)\s+lent\b|\blent\s+to\b", re.I),
    re.compile(r"\btried\s+and\s+(?:not\s+taken|dropped)\b|\bnot\s+taken:", re.I),
    re.compile(r"\bthrow-?away\s+prototype\b", re.I),
]
"""Phrases of development history."""


def _hits(text: str) -> list[str]:
    return [m.group(0) for pattern in DENY for m in pattern.finditer(text)]


def _docstrings(path: Path) -> Iterator[tuple[int, str]]:
    """Every docstring of a module: module, class and function docstrings and the string
    statements that document attributes."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            yield node.lineno, node.value.value


def _text_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]
    files += sorted((ROOT / "docs").glob("**/*.md"))
    files += sorted((ROOT / "configs").glob("**/*.y*ml"))
    return files


def _python_files() -> list[Path]:
    roots = [p.parent for p in ROOT.glob("**/src/mutualrl") if ".venv" not in p.parts]
    files = [f for r in roots for f in sorted(r.glob("mutualrl/**/*.py"))]
    files += [f for f in sorted((ROOT / "tests").glob("**/*.py"))
              if f.resolve() != Path(__file__).resolve()]
    return [f for f in files if not f.name.endswith(("_pb2.py", "_pb2_grpc.py"))]


@pytest.mark.parametrize("text, denied", [
    ("measured on the ninth session's host", True),
    ("an earlier session measured 0.6", True),
    ("(issue 17, point 4)", True),
    ("no larger machine was lent to this project", True),
    ("Not taken: payloads through a script.", True),
    ("tried and not taken", True),
    ("sessions' host", True),
    ("the trainer's Session holds the model", False),
    ("GET /v1/session says whether a token is needed", False),
    ("the tab's sessionStorage", False),
    ("interface the gRPC server binds to: host and port", False),
    ("a host crash can lose one second", False),
    ("the tokenizers are trained once per test process", False),
])
def test_the_deny_list_knows_development_talk_from_product_words(text: str,
                                                                denied: bool) -> None:
    assert bool(_hits(text)) is denied, _hits(text)


def test_readme_docs_and_configs_tell_no_development_history() -> None:
    found = [f"{f.relative_to(ROOT)}:{n}: {hit!r}"
             for f in _text_files()
             for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
             for hit in _hits(line)]
    assert found == []


def test_docstrings_tell_no_development_history() -> None:
    found = [f"{f.relative_to(ROOT)}:{n}: {hit!r}"
             for f in _python_files() for n, doc in _docstrings(f) for hit in _hits(doc)]
    assert found == []


def test_the_scan_covers_the_product() -> None:
    texts = {f.relative_to(ROOT).as_posix() for f in _text_files()}
    assert {"README.md", "docs/design.md", "configs/demo.yaml"} <= texts
    sources = {f.relative_to(ROOT).as_posix() for f in _python_files()}
    assert "services/trainer/src/mutualrl/trainer/runtime/loop.py" in sources
    assert "tests/unit/test_reference_pages.py" in sources


def test_the_readme_is_a_short_manual() -> None:
    """The README says what MutualRL is and how to start; the reference lives in docs/."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250
    for heading in ("## Two commands", "## The demo's result", "## Train your own checkpoints",
                    "## Documentation"):
        assert heading in lines
