"""`mutualrl experiment --quick` end to end: a subprocess starts SEE, THL and MWRA on the real Redis
(REDIS_URL, unique run ids), warm-starts three heterogeneous policies, runs SGT and its controls
with two trainer processes each and PRP with three, and writes results.json / results.md and the
plots. The test checks the outputs' schema and, in SEE's own counts, that every run's records
went through the services and that each sharing probe took its peers' records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(660)]

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "probe-comparison.yaml"
REDIS_URL = "redis://127.0.0.1:6379/0"
# What each probe must take from its peer (SEE counts a record as taken when it is delivered).
TAKES = {"xgrpo": "REWARD_STATS", "sgt": "VERIFIED_SUCCESS", "sgt-self": "VERIFIED_SUCCESS",
         "oracle": "VERIFIED_SUCCESS", "prp-chunk": "ROLLOUT", "hacpo": "ROLLOUT",
         "hacpo-naive": "ROLLOUT", "sapo": "ROLLOUT", "ftis": "ROLLOUT"}
SHORT = ["none", "xgrpo", "sgt", "sgt-self", "oracle", "hacpo", "hacpo-naive", "sapo", "ftis"]
# Each published method's own per-round diagnostic, reported for both policies.
COLLAB = {"hacpo": "hacpo_s_below", "hacpo-naive": "hacpo_row_weight", "sapo": "sapo_groups",
          "ftis": "ftis_kl"}
THREE = ["gpt2-bpe", "llama-char", "qwen2-unigram"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, float]]:
    import redis

    prefix = f"e2ex{uuid.uuid4().hex[:8]}"
    out = tmp_path_factory.mktemp("experiment")
    env = {**os.environ, "REDIS_URL": REDIS_URL}
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "mutualrl.cli", "experiment", "-c", str(CONFIG), "--out",
         str(out), "--quick", "--run-prefix", prefix],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    try:
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
        yield out, prefix, wall
    finally:
        r = redis.Redis.from_url(REDIS_URL)
        # SEE and MWRA keys carry the run id (which starts with the prefix); THL's
        # registrations live under a prefix of their own that contains it too.
        keys = list(r.scan_iter(f"*{prefix}*", count=1000))
        if keys:
            r.delete(*keys)
        r.close()


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def test_outputs_have_the_schema(quick_run: tuple[Path, str, float]) -> None:
    out, prefix, _ = quick_run
    res = _json(out / "results.json")
    assert res["quick"] is True and res["meta"]["seeds"] == [0]
    assert res["meta"]["regime_probes"] == {"short": SHORT, "short3": ["prp-chunk"]}
    assert all(r["status"] == "ok" for r in res["runs"]), res["runs"]
    assert {r["run_id"] for r in res["runs"]} == (
        {f"{prefix}-short-{p}-s0" for p in SHORT} | {f"{prefix}-short3-prp-chunk-s0"})
    reg = res["regimes"]["short"]
    pols = reg["policies"]
    assert pols == ["gpt2-bpe", "llama-char"]
    assert res["regimes"]["short3"]["policies"] == THREE
    assert reg["skills"] == ["add", "sub", "rev", "sort"]
    # Warm starts: checked accuracies recorded per skill, strong/weak split as configured; the
    # two-policy and three-policy regimes share the warm starts of their common policies.
    ws = res["warm_starts"]["short"]
    assert ws["gpt2-bpe"]["strong_skills"] == ["add", "rev"]
    assert set(ws["llama-char"]["heldout_accuracy"]) == {"add", "sub", "rev", "sort", "mean"}
    assert res["warm_starts"]["short3"]["gpt2-bpe"]["path"] == ws["gpt2-bpe"]["path"]
    assert res["warm_starts"]["short3"]["qwen2-unigram"]["strong_skills"] == ["add", "sort"]
    for p in SHORT:
        e = reg["probes"][p]
        for pol in pols:
            pe = e["policies"][pol]
            for key in ("final", "best"):
                for skill in [*reg["skills"], "mean"]:
                    est = pe[key][skill]
                    assert 0.0 <= est["lo"] <= est["mean"] <= est["hi"] <= 1.0
                    assert est["n"] == 1
            assert set(pe["vs_warm"]) == {*reg["skills"], "mean"}
            assert pe["diagnostics"]["rounds"]["mean"] == 4
            assert "fallback_rounds" in pe["diagnostics"]
            # Stability-support diagnostics were measured in every arm.
            assert "kl_warm" in pe["diagnostics"] and "grad_norm" in pe["diagnostics"]
            if p != "none":
                assert pe["vs_none"]["mean"] is not None
            if p in COLLAB:
                assert COLLAB[p] in pe["diagnostics"], (p, pol, sorted(pe["diagnostics"]))
        assert 0.0 <= e["both"]["final"]["mean"] <= 1.0
        assert e["wall_s"]["mean"] > 0
        if p != "none":  # every arm's wall time against GRPO's of the same seed
            assert e["wall_vs_none"]["mean"] > 0
        curve = reg["curves"][p][pols[0]]
        assert curve["rounds"] == [0, 2, 4]
    for p in ("sgt", "sgt-self", "oracle"):
        d = reg["probes"][p]["policies"]["llama-char"]["diagnostics"]
        assert d["rescues_per_round"]["mean"] > 0 and "loss_sgt" in d, p
    assert {(c["a"], c["b"]) for c in reg["contrasts"]} == {
        ("sgt", "sgt-self"), ("oracle", "sgt"), ("sgt", "none"), ("hacpo", "hacpo-naive")}
    assert set(reg["transfer"]) == {"sgt", "sgt-self", "oracle"}
    assert "rev" in reg["transfer"]["sgt"]["llama-char"]["gpt2-bpe"]["skills"]
    assert set(reg["tradeoff"]["arms"]) == set(SHORT)
    md = (out / "results.md").read_text()
    for heading in ("## Regime `short`", "## Regime `short3`", "Warm start",
                    "Final held-out reward@1", "transfer matrix", "Controls", "sgt − sgt-self",
                    "Transfer matrix under `sgt`", "Stability–support", "Probe diagnostics",
                    "Records through SEE", "Wall time per run", "HACPO, SAPO and F-TIS"):
        assert heading in md, heading
    assert (out / "curves.png").stat().st_size > 10_000
    assert (out / "tradeoff-short.png").stat().st_size > 20_000
    for regime, p, names in [*(("short", p, pols) for p in SHORT),
                             ("short3", "prp-chunk", THREE)]:
        run_dir = out / "runs" / f"{prefix}-{regime}-{p}-s0"
        for pol in names:
            rows = [json.loads(x) for x in (run_dir / pol / "metrics.jsonl").read_text()
                    .splitlines()]
            assert [r["round"] for r in rows] == [0, 1, 2, 3]
            assert "heldout/mean" in rows[-1]
            assert all("support_prompts" in r for r in rows)  # measured every round
        info = _json(run_dir / "run.json")
        assert info["status"] == "ok" and info["exit_codes"] == {pol: 0 for pol in names}


def test_every_probe_went_through_the_services(quick_run: tuple[Path, str, float]) -> None:
    out, prefix, _ = quick_run
    for regime, probe, names in [*(("short", p, ["gpt2-bpe", "llama-char"]) for p in SHORT),
                                 ("short3", "prp-chunk", THREE)]:
        stats = _json(out / "runs" / f"{prefix}-{regime}-{probe}-s0" / "see_stats.json")
        published = {p["policy_id"]: p["published"] for p in stats["policies"]}
        for pol in names:
            # 4 rounds x 8 prompts x G=4 rollouts, and one REWARD_STATS per prompt.
            assert published[pol]["ROLLOUT"] == 4 * 8 * 4, (probe, pol, published)
            assert published[pol]["REWARD_STATS"] == 4 * 8, (probe, pol, published)
        matrix = stats["matrix"]
        if probe == "none":
            # Plain GRPO trains on no peer record; only the support diagnostic reads successes.
            assert not matrix.get("ROLLOUT")
            continue
        kind = TAKES[probe]
        taken = sum(n for sources in matrix.get(kind, {}).values() for n in sources.values())
        assert taken > 0, (probe, matrix)
        if probe == "prp-chunk":
            # Every round every policy reads both peers' rollouts.
            assert set(matrix[kind]) == set(THREE), matrix
            assert all(set(src) == set(THREE) - {t} for t, src in matrix[kind].items()), matrix
    # The summary in results.json carries the same counts.
    res = _json(out / "results.json")
    see = res["regimes"]["short3"]["probes"]["prp-chunk"]["see"]
    assert see["taken_mean"]["ROLLOUT"]["llama-char"]["qwen2-unigram"] > 0
    # PRP's cap (2 in --quick) counts per peer: with two peers up to 4 of their rollouts join
    # each of the 8 groups of a round, more than a cap over all peers (2 x 8) would let in.
    for pol in THREE:
        rows = [json.loads(x) for x in (out / "runs" / f"{prefix}-short3-prp-chunk-s0" / pol
                                        / "metrics.jsonl").read_text().splitlines()]
        counts = [r.get("peer_samples", 0.0) for r in rows]
        assert max(counts) > 2 * 8 and max(counts) <= 2 * 2 * 8, (pol, counts)
