"""The GPU images' constraints files follow the CPU sets they are derived from."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def load() -> ModuleType:
    path = ROOT / "scripts" / "constraints.py"
    spec = importlib.util.spec_from_file_location("constraints", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pins(text: str) -> dict[str, str]:
    return dict(line.split("==", 1) for line in text.splitlines()
                if line and not line.startswith("#"))


def test_the_vllm_gpu_set_swaps_the_cpu_build_for_the_cuda_one() -> None:
    c = load()
    got = pins(c.gpu_vllm_text("# header\nnumba==0.65.0\ntorch==2.13.0\nvllm-cpu==0.32.0\n"))
    assert got == {"numba": "0.65.0", "torch": "2.13.0", "vllm": "0.32.0"}


def test_the_sglang_gpu_set_takes_sglangs_pins_and_drops_the_unpinned() -> None:
    c = load()
    got = pins(c.gpu_text("absl-py==2.5.1\nllvmlite==0.40.0\ntorch==2.13.0\n"))
    assert got == {"absl-py": "2.5.1", **c.GPU_PINS}


def test_the_committed_gpu_files_follow_their_sets() -> None:
    c = load()
    assert c.check_gpu(ROOT / "constraints.txt", ROOT / "deploy/docker/constraints-gpu-sglang.txt",
                       ROOT / "constraints-vllm.txt",
                       ROOT / "deploy/docker/constraints-gpu-vllm.txt") == []
