"""configs/async-speeds.yaml through `mutualrl up`: two policies of very different speeds in
the asynchronous mode. Keeping within `exchange.max_lead_rounds` of the slow one, the fast one
reads its peer in its rounds too, and records cross both ways."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from tiny_up import metrics_rows, run_up

pytestmark = [pytest.mark.slow, pytest.mark.timeout(960)]
ROOT = Path(__file__).resolve().parents[2]


def test_unequal_speeds_share_in_the_rounds_of_both(tmp_path: Path) -> None:
    cfg = yaml.safe_load((ROOT / "configs/async-speeds.yaml").read_text())
    tr = cfg["trainer"]
    tr["output_dir"] = str(tmp_path / "runs")
    tr["grpo"]["rounds"] = 4
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run_dir = tmp_path / "runs" / tr["run_id"]
    summary, console = run_up(path, run_dir, timeout=900)
    res = summary["results"]
    rows = {n: metrics_rows(run_dir, n) for n in ("fast", "slow")}
    # the slow policy's rounds take several times the fast one's own work
    cost = {n: sum(r["cost_s"] for r in rows[n]) for n in rows}
    assert cost["slow"] > 2 * cost["fast"], cost
    for name in ("fast", "slow"):
        sharing = res[name]["sharing"]
        assert sharing["rounds"] == 4 and sharing["shared"] >= 1, (name, sharing)
        assert sharing["fraction"] == pytest.approx(sharing["shared"] / 4)
    assert res["fast"]["sharing"]["lead_wait_s"] > 0  # the fast one waited for its peer
    matrix = summary["see_stats"]["matrix"]["REWARD_STATS"]
    assert matrix["fast"]["slow"] > 0 and matrix["slow"]["fast"] > 0
    assert "rounds that read peer data" in console
