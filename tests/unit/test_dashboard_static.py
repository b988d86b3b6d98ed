"""The dashboard's static files: shipped in the package, the vendored charting library exactly as
pinned, every module the page imports present, no inline script (the page's CSP forbids it)."""

import hashlib
import re
import tomllib
from pathlib import Path

from mutualrl.see.dashboard.ui import STATIC, is_public

ROOT = Path(__file__).resolve().parents[2]


def test_vendored_uplot_matches_the_pinned_hashes() -> None:
    readme = (STATIC / "vendor" / "README.md").read_text()
    listed = dict((name, digest) for digest, name in
                  re.findall(r"^([0-9a-f]{64})  (\S+)$", readme, flags=re.M))
    assert set(listed) == {"uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE"}
    for name, digest in listed.items():
        assert hashlib.sha256((STATIC / "vendor" / name).read_bytes()).hexdigest() == digest
    assert "(v1.6.32)" in (STATIC / "vendor" / "uPlot.iife.min.js").read_text()[:200]


def test_every_imported_module_exists() -> None:
    modules = list(STATIC.rglob("*.js"))
    assert len(modules) >= 10
    for mod in modules:
        if mod.parent.name == "vendor":
            continue
        for target in re.findall(r'^import .* from "(\.[^"]+)";$', mod.read_text(), re.M):
            assert (mod.parent / target).resolve().is_file(), f"{mod.name} imports {target}"


def test_page_has_no_inline_script_and_loads_only_shipped_files() -> None:
    html = (STATIC / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html)
    assert not re.search(r"\son[a-z]+\s*=", html)  # no inline event handler attributes
    for ref in re.findall(r'(?:src|href)="(/ui/static/[^"]+)"', html):
        assert (STATIC / ref.removeprefix("/ui/static/")).is_file(), ref


def test_package_data_ships_every_static_file() -> None:
    cfg = tomllib.loads((ROOT / "services/see/pyproject.toml").read_text())
    patterns = cfg["tool"]["setuptools"]["package-data"]["mutualrl.see.dashboard"]
    base = STATIC.parent
    shipped = {p for pat in patterns for p in base.glob(pat) if p.is_file()}
    assert shipped == {p for p in STATIC.rglob("*") if p.is_file()}


def test_only_pages_are_public() -> None:
    assert is_public("/ui") and is_public("/ui/") and is_public("/ui/runs/x/curves")
    assert is_public("/ui/static/app.js") and is_public("/")
    assert not is_public("/uix") and not is_public("/v1/runs") and not is_public("/metrics")
