"""Round metrics to JSONL (the record of a run), TensorBoard, Prometheus, a progress line, SEE
(live dashboard, `live_metrics.py`) and optionally Weights & Biases (`wandb_log.py`).

Every sink gets the same flat dict of floats per round; names are stable (plots and tests read
them): reward_mean, pass_rate, loss, loss_pg, loss_sgt, kl, clip_frac, approx_kl (old -> new
policy over the round's updates), updates, grad_norm, rescued_prompts,
baseline_shift, prp_w_mean/var/kept/clipped, thl_multi_token_chunk_share, tokens_per_s,
step_s, peak_rss_mib, heldout/<skill>, fallback ...
"""

from __future__ import annotations

import json
import math
import re
import resource
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Gauge, start_http_server
from rich.console import Console

from mutualrl.trainer.config.run import MetricsSettings
from mutualrl.trainer.runtime.live_metrics import SeeMetricsReporter
from mutualrl.trainer.runtime.wandb_log import WandbSink

if TYPE_CHECKING:  # tensorboard loads only when metrics.tensorboard is on
    from torch.utils.tensorboard import SummaryWriter

_PROM_NAME = re.compile(r"[^a-zA-Z0-9_]")


class MetricsSink:
    """Writes one policy's round metrics to every configured sink."""

    def __init__(self, out_dir: Path, policy: str, settings: MetricsSettings,
                 reporter: SeeMetricsReporter | None = None, run_id: str = "",
                 run_config: dict[str, Any] | None = None) -> None:
        """`reporter` streams the rows to SEE's dashboard; `run_id` and `run_config` name and
        describe W&B runs."""
        out_dir.mkdir(parents=True, exist_ok=True)
        self.policy = policy
        self.settings = settings
        self._reporter = reporter
        self._wandb: WandbSink | None = None
        if settings.wandb is not None:
            self._wandb = WandbSink(settings.wandb, out_dir, run_id or policy, policy, run_config)
        self.jsonl_path = out_dir / "metrics.jsonl"
        self._jsonl = self.jsonl_path.open("a", encoding="utf-8")
        self._tb: SummaryWriter | None = None
        if settings.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(out_dir / "tb"))
        self._registry: CollectorRegistry | None = None
        self._gauges: dict[str, Gauge] = {}
        self.prometheus_port: int | None = None
        if settings.prometheus_port is not None:
            self._start_prometheus(settings.prometheus_port)
        self._console: Console | None = None
        if settings.progress:
            self._console = Console(stderr=True)

    def truncate_from(self, round_k: int) -> None:
        """Drop JSONL rows of rounds >= round_k (and a line a crash left half written): the
        trainer starts at round_k (from a checkpoint of round_k, or afresh at 0), so those
        rounds run again and would otherwise appear twice."""
        self._jsonl.close()
        rows = self.jsonl_path.read_text(encoding="utf-8").splitlines()
        kept = [r for r in rows if _round_of(r) < round_k]
        tmp = self.jsonl_path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(r + "\n" for r in kept), encoding="utf-8")
        tmp.replace(self.jsonl_path)
        self._jsonl = self.jsonl_path.open("a", encoding="utf-8")

    def _start_prometheus(self, port: int) -> None:
        # A private registry: several trainers (tests) in one process must not collide.
        self._registry = CollectorRegistry()
        server, _ = start_http_server(port, addr="127.0.0.1", registry=self._registry)
        self._prom_server = server
        self.prometheus_port = server.server_port

    def _gauge(self, name: str) -> Gauge:
        key = "mutualrl_trainer_" + _PROM_NAME.sub("_", name)
        if key not in self._gauges:
            self._gauges[key] = Gauge(key, f"trainer metric {name}", ["policy"],
                                      registry=self._registry)
        return self._gauges[key]

    def log(self, round_k: int, values: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in values.items() if math.isfinite(float(v))}
        row = {"round": round_k, "policy": self.policy, "time": time.time(), **clean}
        self._jsonl.write(json.dumps(row) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            for k, v in clean.items():
                self._tb.add_scalar(k, v, round_k)
        if self._registry is not None:
            for k, v in clean.items():
                self._gauge(k).labels(policy=self.policy).set(v)
        if self._reporter is not None:
            self._reporter.report(round_k, clean)
        if self._wandb is not None:
            self._wandb.log(round_k, clean)
        if self._console is not None:
            self._console.print(progress_line(self.policy, round_k, clean), highlight=False)

    def close(self) -> None:
        self._jsonl.close()
        if self._reporter is not None:
            self._reporter.close()
        if self._wandb is not None:
            self._wandb.close()
        if self._tb is not None:
            self._tb.close()
        if self._registry is not None:
            self._prom_server.shutdown()


def peak_rss_mib() -> float:
    """The process's peak resident memory so far in MiB (what `--dry-run` plans on a CPU)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _round_of(line: str) -> float:
    """The round of a metrics.jsonl line; infinity for one that is not a whole row."""
    try:
        return float(json.loads(line)["round"])
    except (ValueError, KeyError, TypeError):
        return math.inf


def progress_line(policy: str, round_k: int, v: dict[str, float]) -> str:
    """One short rich-markup line: the figures a person watches while a run trains."""
    parts = [f"[bold]{policy}[/] r{round_k:>4}",
             f"reward {v.get('reward_mean', 0.0):.3f}",
             f"pass {v.get('pass_rate', 0.0):.2f}",
             f"loss {v.get('loss', 0.0):+.4f}"]
    for key, label in (("rescued_prompts", "rescued"), ("baseline_shift", "shift"),
                       ("prp_w_kept", "kept"), ("kl", "kl")):
        if key in v and (key != "kl" or v[key] > 0):  # KL only where there is a reference
            parts.append(f"{label} {v[key]:.3g}")
    parts.append(f"{v.get('step_s', 0.0):.2f}s")
    held = [f"{k.split('/', 1)[1]} {x:.2f}" for k, x in v.items() if k.startswith("heldout/")]
    if held:
        parts.append("[cyan]held-out " + " ".join(held) + "[/]")
    return "  ".join(parts)
