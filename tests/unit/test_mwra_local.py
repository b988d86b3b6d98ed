"""Local mode helpers, the config section and the bench command (no network)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import ValidationError

from mutualrl.cli import main
from mutualrl.client.local_worker import local_worker
from mutualrl.common.config import load_section
from mutualrl.mwra.config import MwraConfig
from mutualrl.trainer.runtime.allocator import apply_allocation

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class FakeAlloc:  # the three fields apply_allocation reads, as on allocation_pb2.Allocation
    threads: int
    rollout_budget: int
    active: bool


def test_apply_allocation_sets_torch_threads_and_returns_budget() -> None:
    import torch

    before = torch.get_num_threads()
    try:
        assert apply_allocation(FakeAlloc(threads=1, rollout_budget=48, active=True)) == 48
        assert torch.get_num_threads() == 1
        assert apply_allocation(FakeAlloc(threads=2, rollout_budget=16, active=True)) == 16
        assert torch.get_num_threads() == 2
        # sitting a time-share round out: budget 0, threads left alone
        assert apply_allocation(FakeAlloc(threads=0, rollout_budget=16, active=False)) == 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_apply_allocation_accepts_the_protobuf_message() -> None:
    import torch

    from mutualrl.v1 import allocation_pb2 as pb

    before = torch.get_num_threads()
    try:
        alloc = pb.Allocation(threads=1, rollout_budget=7, active=True, units=1)
        assert apply_allocation(alloc) == 7 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_local_worker_describes_this_machine() -> None:
    wid, slots, labels = local_worker()
    assert wid.startswith("local-") and slots == (os.cpu_count() or 1)
    assert labels["mode"] == "local"
    assert local_worker("me", 3)[:2] == ("me", 3)


def test_config_defaults_env_and_example_section(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REDIS_URL", raising=False)
    cfg = MwraConfig()
    assert (cfg.port, cfg.metrics_port, cfg.strategy) == (50053, 9103, "balanced")
    assert cfg.redis_url == "redis://127.0.0.1:6379/0"
    monkeypatch.setenv("REDIS_URL", "redis://redis:6379/2")
    assert MwraConfig().redis_url == "redis://redis:6379/2"
    example = load_section(ROOT / "configs" / "mwra.yaml", "mwra", MwraConfig, port=0)
    assert example.host == "0.0.0.0" and example.port == 0 and example.hysteresis == 0.1
    for field, info in MwraConfig.model_fields.items():
        assert info.description, f"{field} lacks a docstring"
    with pytest.raises(ValidationError, match="strategy"):
        MwraConfig(strategy="greedy")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="tick_seconds"):
        MwraConfig(tick_seconds=5, lock_ttl_seconds=1)
    with pytest.raises(ValidationError, match="smoothing"):
        MwraConfig(smoothing=0)
    with pytest.raises(ValidationError, match="extra"):
        MwraConfig.model_validate({"leases": 3})


def test_bench_mwra_writes_ratio_and_idle_fraction(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench" / "mwra.json"
    assert main(["bench", "mwra", "--json", str(out), "--rounds", "100"]) == 0
    report = json.loads(out.read_text())
    ratio = report["makespan_ratio_balanced_over_static"]
    assert 0.55 < ratio < 0.8
    assert report["noise_free"]["makespan_ratio_balanced_over_static"] < 0.7
    assert report["idle_fraction_balanced"] < report["idle_fraction_static"]
    assert report["noise_free"]["static"]["idle_fraction"] == pytest.approx(1 / 3)
    assert "balanced/static makespan ratio" in capsys.readouterr().out


def test_a_short_pool_mode_has_one_name_and_the_earlier_one_is_an_alias() -> None:
    """`shared` is what the config, the plans (Allocation.strategy) and the docs call the mode;
    `share`, its earlier name, still loads (with a DeprecationWarning)."""
    assert MwraConfig(short_pool="shared").short_pool == "shared"
    with pytest.warns(DeprecationWarning, match="shared"):
        assert MwraConfig(short_pool="share").short_pool == "shared"
    with pytest.raises(ValidationError, match="short_pool"):
        MwraConfig(short_pool="sharing")
