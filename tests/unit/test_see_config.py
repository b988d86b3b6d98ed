"""The example `see:` section loads, and every SEE config field is documented."""

from __future__ import annotations

from pathlib import Path

import pytest

from mutualrl.common.config import load_section
from mutualrl.see.config import DEFAULT_REDIS_URL, RetentionDefaults, SeeConfig, SeeLimits

ROOT = Path(__file__).resolve().parents[2]


def test_example_config_loads() -> None:
    cfg = load_section(ROOT / "configs" / "see.yaml", "see", SeeConfig, port=6000)
    assert (cfg.host, cfg.port, cfg.rest_port) == ("0.0.0.0", 6000, 8080)
    assert cfg.retention.max_stream_len == 100_000
    assert cfg.limits.max_batch_records == 4096
    demo = load_section(ROOT / "configs" / "demo.yaml", "see", SeeConfig)
    assert demo.retention.max_stream_len == 200_000


def test_redis_url_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert SeeConfig().redis_url == DEFAULT_REDIS_URL
    monkeypatch.setenv("REDIS_URL", "redis://elsewhere:6380/2")
    assert SeeConfig().redis_url == "redis://elsewhere:6380/2"
    with pytest.raises(ValueError, match="retention"):
        SeeConfig.model_validate({"retention": {"max_stream_len": 0}})


@pytest.mark.parametrize("model", [SeeConfig, SeeLimits, RetentionDefaults])
def test_every_field_documented(model: type) -> None:
    for name, field in model.model_fields.items():  # type: ignore[attr-defined]
        assert field.description, f"{model.__name__}.{name} has no description"
