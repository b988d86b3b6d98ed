"""Round metrics reach JSONL, TensorBoard and the Prometheus endpoint with the same values."""

import json
import urllib.request
from pathlib import Path

from mutualrl.trainer.config.run import MetricsSettings
from mutualrl.trainer.runtime.metrics import MetricsSink, progress_line


def test_sinks_write_the_same_values(tmp_path: Path) -> None:
    sink = MetricsSink(tmp_path, "A", MetricsSettings(prometheus_port=0, progress=False))
    sink.log(0, {"reward_mean": 0.25, "loss": -0.5, "heldout/add": 1.0, "bad": float("nan")})
    sink.log(1, {"reward_mean": 0.75, "loss": 0.125})
    body = urllib.request.urlopen(f"http://127.0.0.1:{sink.prometheus_port}/metrics").read()
    text = body.decode()
    assert 'mutualrl_trainer_reward_mean{policy="A"} 0.75' in text
    assert 'mutualrl_trainer_heldout_add{policy="A"} 1.0' in text
    sink.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [0, 1]
    assert rows[0]["reward_mean"] == 0.25 and "bad" not in rows[0]
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tb").iterdir())


def test_progress_line_shows_what_matters() -> None:
    line = progress_line("B", 7, {"reward_mean": 0.5, "pass_rate": 0.5, "loss": 0.1,
                                  "rescued_prompts": 2.0, "step_s": 0.3, "heldout/rev": 0.9})
    assert "r   7" in line and "reward 0.500" in line and "rescued 2" in line
    assert "rev 0.90" in line


def test_a_restart_drops_the_rounds_it_runs_again(tmp_path: Path) -> None:
    """A trainer that starts at round k (its checkpoint's, or 0 without one) keeps rows of
    earlier rounds only, a half-written last line included, and logs the rest once."""
    sink = MetricsSink(tmp_path, "A", MetricsSettings(progress=False, tensorboard=False))
    for k in range(4):
        sink.log(k, {"reward_mean": float(k)})
    sink.close()
    with (tmp_path / "metrics.jsonl").open("a") as fh:
        fh.write('{"round": 4, "rew')  # a crash mid-write
    for start in (2, 0):
        sink = MetricsSink(tmp_path, "A", MetricsSettings(progress=False, tensorboard=False))
        sink.truncate_from(start)
        for k in range(start, 5):
            sink.log(k, {"reward_mean": 10.0 + k})
        sink.close()
        rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        assert [r["round"] for r in rows] == [0, 1, 2, 3, 4]
        assert [r["reward_mean"] for r in rows][start:] == [10.0 + k for k in range(start, 5)]
