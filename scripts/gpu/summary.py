"""The one JSON of `scripts/gpu/check.sh`: the environment, each part's status and figures,
tests/gpu's outcome, and the targets of the rollout and memory benchmarks, met or missed.

    python scripts/gpu/summary.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ENGINE_FIGURES = ("tokens_per_s", "share_of_bound", "peak_alloc_gib", "peak_reserved_gib",
                  "peak_rss_mb", "sync_s", "warmup_s")
TOP_FIGURES = ("device_name", "shape", "sequences", "new_tokens", "prompt_tokens", "params",
               "complete", "ratio", "ratio_hf_over_generate", "ratio_generate",
               "ratio_generate_static", "ratio_hf_autocast", "bound_tokens_per_s",
               "matmul_bound_tokens_per_s",
               "bandwidth_tbps", "hf_capture_s", "hf_graph_captures", "hf_graph_replays",
               "hf_pool_gib", "generate_static_compile_s", "load_start", "load_end")
SHAPE_FIGURES = ("device_name", "shape", "complete", "rollouts", "new_tokens", "step_s",
                 "rollout_s", "rollout_share", "rollout_tokens_per_s", "sample_weights",
                 "planned_peak_gib", "measured_max_allocated_gib", "measured_max_reserved_gib",
                 "plan_over_measured", "reserved_over_allocated", "plan_items_gib", "rounds",
                 "allocator", "engine", "generate_s", "update_s", "max_off_policy_steps")


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _rollout(r: dict[str, Any]) -> dict[str, Any]:
    out = {k: r[k] for k in TOP_FIGURES if k in r}
    out["engines"] = {n: {k: r[f"{n}_{k}"] for k in ENGINE_FIGURES if f"{n}_{k}" in r}
                      for n in r.get("engines", [])}
    return out


def _pytest(path: Path) -> dict[str, Any] | None:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    cases = []
    for case in root.iter("testcase"):
        outcome = "passed"
        message = ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = {"failure": "failed", "error": "error"}.get(tag, "skipped")
                message = (found.get("message") or "")[:300]
        cases.append({"test": f"{case.get('classname')}::{case.get('name')}",
                      "outcome": outcome, **({"message": message} if message else {})})
    counts: dict[str, int] = {}
    for c in cases:
        counts[c["outcome"]] = counts.get(c["outcome"], 0) + 1
    return {"counts": counts, "tests": cases}


def summary(out: Path) -> dict[str, Any]:
    parts = {p.name.removesuffix(".status.json"): _read(p)
             for p in sorted(out.glob("*.status.json"))}
    res: dict[str, Any] = {"env": _read(out / "env.json"), "parts": parts}
    for name in ("rollout-1.5b", "rollout-llama", "rollout-tiny"):
        r = _read(out / f"{name}.json")
        if r:
            res[name] = _rollout(r)
    shape = _read(out / "shape-1.5b.json")
    if shape:
        res["shape-1.5b"] = {k: shape[k] for k in SHAPE_FIGURES if k in shape}
    overlap = _read(out / "overlap-1.5b.json")
    if overlap:
        res["overlap-1.5b"] = {k: overlap[k] for k in SHAPE_FIGURES if k in overlap}
    res["pytest"] = _pytest(out / "pytest.xml")
    big = res.get("rollout-1.5b", {})
    engines = big.get("engines", {})
    targets: dict[str, Any] = {}
    if "ratio" in big:
        targets["fast_path_over_hf_loop>=5"] = big["ratio"]
    if "ratio_hf_over_generate" in big:
        targets["fast_path_over_generate_eager>=3"] = big["ratio_hf_over_generate"]
    if "hf" in engines and "share_of_bound" in engines["hf"]:
        targets["fast_path_share_of_bound (goal 0.5)"] = engines["hf"]["share_of_bound"]
    if shape and "rollout_share" in shape:
        targets["rollout_share_of_round<=0.5"] = shape["rollout_share"]
    if shape and "plan_over_measured" in shape:
        targets["plan_over_measured_allocation_within_0.9-1.1"] = shape["plan_over_measured"]
    if shape and overlap and overlap.get("step_s"):
        # rounds/s with the rollout worker (d = 1) over in-process rounds at the same shape
        targets["overlap_rounds_per_s_ratio>=1.4"] = shape["step_s"] / overlap["step_s"]
    res["targets"] = targets
    return res


if __name__ == "__main__":
    print(json.dumps(summary(Path(sys.argv[1])), indent=1))
