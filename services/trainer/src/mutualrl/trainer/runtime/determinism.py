"""What the deterministic mode (`exchange.mode: deterministic`) fixes besides the exchange:
kernels that pick their algorithm or reduction order at run time, and which metrics are
timings (the only values of metrics.jsonl that two runs of one seed do not share)."""

from __future__ import annotations

import logging
import os

import torch

log = logging.getLogger(__name__)

TIMING_KEYS = frozenset({"time", "step_s", "wait_s", "cost_s", "rollout_s", "probe_s",
                         "tokens_per_s", "diag_s", "peak_rss_mib", "rollout/capture_s",
                         "generate_s", "update_s", "overlap_s"})
"""Round metrics that measure the machine (wall time, the process's memory); every other value
is a function of seed and round."""


def fix_kernels(device: str) -> None:
    """Deterministic kernels: torch's deterministic algorithms (an op that has none warns,
    naming itself, rather than failing the run), cuBLAS's fixed workspace on CUDA, and no
    cuDNN autotuning. On CPU torch's kernels already reduce in a fixed order for a fixed
    thread count, which the deterministic mode also fixes (MWRA's grants are not applied)."""
    if device.startswith("cuda"):
        # cuBLAS reads it when its handle is created: before the first CUDA matmul.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    log.info("deterministic kernels on %s", device)


def comparable(row: dict[str, object]) -> dict[str, object]:
    """A metrics.jsonl row without its timings: what must repeat for a seed."""
    return {k: v for k, v in row.items() if k not in TIMING_KEYS}
