"""The generated documentation pages: every config model's every field is documented, and the
checked-in configuration reference and package table are what the code gives today."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import Field

from mutualrl.common.config import Config

ROOT = Path(__file__).resolve().parents[2]


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reference_pages",
                                                  ROOT / "scripts" / "reference_pages.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


pages = _module()


def test_every_config_model_is_found_and_every_field_has_a_docstring() -> None:
    found = pages.find_config_classes()
    models = pages.load(found)
    # The sections' models and the ones they nest, across every package.
    for name in ("SeeConfig", "SeeLimits", "RetentionDefaults", "ThlConfig", "MwraConfig",
                 "ServiceConfig", "ClientOptions", "TrainerConfig", "GRPOSettings",
                 "ProbeSettings", "PolicySettings", "LoraSettings", "TaskConfig",
                 "JsonlTaskConfig", "SFTConfig", "UpConfig", "ExperimentConfig", "RegimeSpec",
                 "PolicySpec", "WarmStartSettings"):
        assert name in models, f"{name} not found among the config models"
    assert all(issubclass(m, Config) for m in models.values())
    assert pages.undocumented(models) == []


def test_a_field_without_a_docstring_is_reported() -> None:
    class Documented(Config):
        a: int = 1
        """An integer."""
        b: int = Field(2, description="Another.")

    class Careless(Config):
        a: int = 1
        """An integer."""
        b: int = 2

    assert pages.undocumented({"Documented": Documented}) == []
    assert pages.undocumented({"Careless": Careless}) == ["Careless.b"]


def test_a_new_config_model_is_found_in_the_sources(tmp_path: Path) -> None:
    src = tmp_path / "pkg" / "src" / "mutualrl" / "extra"
    src.mkdir(parents=True)
    (src / "config.py").write_text(
        "from mutualrl.common.config import Config, ServiceConfig\n"
        "class A(Config):\n    x: int = 1\n"
        "class B(A):\n    y: int = 2\n"
        "class C(ServiceConfig):\n    pass\n"
        "class NotAConfig:\n    pass\n")
    found = {(c.module, c.name) for c in pages.find_config_classes(tmp_path)}
    assert found == {("mutualrl.extra.config", "A"), ("mutualrl.extra.config", "B"),
                     ("mutualrl.extra.config", "C")}


def test_the_configuration_page_lists_every_field_with_its_docstring() -> None:
    models = pages.load(pages.find_config_classes())
    text = pages.render_configuration(models)
    for name, model in models.items():
        assert f"### {name}\n" in text
        for field, info in model.model_fields.items():
            assert f"| `{field}` |" in text
            assert " ".join((info.description or "").split()).replace("|", "\\|") in text
    assert "| `grace_seconds` | float | `5.0` |" in text
    assert "[GRPOSettings](#grposettings)" in text


@pytest.mark.parametrize("page", ["configuration.md", "layout.md"])
def test_the_checked_in_pages_are_current(page: str) -> None:
    expected = {p.name: text for p, text in pages.expected_pages().items()}
    current = (ROOT / "docs" / page).read_text(encoding="utf-8")
    assert current == expected[page], f"docs/{page} is stale: run `make docs`"


def test_the_package_table_has_a_row_per_package() -> None:
    table = pages.render_packages()
    for name, folder in (("mutualrl-proto", "proto/"), ("mutualrl-see", "services/see/"),
                         ("mutualrl-launcher", "launcher/")):
        assert f"| {name} | `{folder}` |" in table
    assert table.count("\n| mutualrl-") == len(pages.source_roots())


def test_the_docs_build_fails_on_a_field_without_a_docstring(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from mkdocs.exceptions import PluginError

    class Careless(Config):
        a: int = 1

    monkeypatch.setattr(pages, "load", lambda found: {"Careless": Careless})
    with pytest.raises(PluginError, match=r"Careless\.a"):
        pages.on_pre_build({})
    assert pages.main(["--check"]) == 1


def test_the_layer_table_has_the_contracts_layers_top_first(tmp_path: Path) -> None:
    table = pages.render_layers()
    rows = [line.split(" | ")[0].strip("| `") for line in table.splitlines()[2:]]
    assert rows == [f"mutualrl.trainer.{layer}" for layer in
                    ("cli", "runtime", "sharing", "data", "engines", "model", "config", "algos")]
    assert ("| `mutualrl.trainer.engines` | `base`, `factory`, `hf`, `sampling`, `sglang`, "
            "`static_decode`, `vllm` |") in table
    assert "`exchange`, `record_ids`, `probes/`" in table
    # a layer without a package docstring cannot be described: the page refuses
    root = tmp_path / "ws"
    pkg = root / "svc" / "src" / "mutualrl" / "trainer"
    (pkg / "top").mkdir(parents=True)
    (pkg / "top" / "__init__.py").write_text("")
    (root / "pyproject.toml").write_text(
        '[[tool.importlinter.contracts]]\nname = "x"\ntype = "layers"\n'
        'containers = ["mutualrl.trainer"]\nlayers = ["top"]\n')
    with pytest.raises(pages.PageError, match=r"mutualrl\.trainer\.top has no package docstring"):
        pages.render_layers(root)
