"""Data parallel for one policy (`nproc`), on real processes: `mutualrl train --nproc 2` starts
two gloo ranks through the elastic launcher, FSDP2 shards the policy over them.

- 2 ranks end 3 rounds with the parameters one process ends with, up to reduction order;
- a 2-rank checkpoint (DCP) resumes on 1 process, and a 1-process checkpoint on 2 ranks, each
  reaching the same parameters as the uninterrupted run;
- a rank SIGKILLed mid-run brings the policy down (no hang: the launcher exits non-zero within
  a bound) and the supervisor restarts it from the last checkpoint; SIGTERM then stops both
  ranks after the same round, with a checkpoint, and exit status 0.

One policy across nodes (`nnodes`): two `mutualrl train --node-rank K` launchers on loopback
join one c10d rendezvous (node 0 serves it), one gloo rank each:

- 2 nodes x 1 rank end 3 rounds with the parameters of 1 node x 2 ranks (and of one process),
  with FSDP2 over both ranks and with HSDP (replicated across the nodes);
- a checkpoint of 2 nodes resumes on one process, and one process's on 2 nodes;
- a launch across nodes without a rendezvous endpoint, or with a node rank out of range, is
  refused before anything starts (exit 2, the field named).

Plain GRPO (`services.local`): no SEE; the probe plan's broadcast is still exercised (rank 0
plans, rank 1 receives it). A tiny warm start gives groups with reward variance, so every
test has gradients to get wrong.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from mutualrl.launch.probes import free_port

pytestmark = pytest.mark.timeout(240)

ROUNDS = 3
ATOL = 1e-5
"""Largest allowed |difference| of any parameter between N ranks and one process. The only
difference is the order of floating-point sums (gradient reduce-scatter, batch shapes in
sampling); measured about 1.3e-7 on float32 weights of magnitude ~0.1-1 after 3 steps."""
KILL_BOUND_S = 60.0
"""A policy whose rank died must have exited within this many seconds."""
CLI = [sys.executable, "-m", "mutualrl.cli"]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a 25-step warm start of llama-char, the preset cache): some answers well-formed, some
    not, so groups have reward variance."""
    root = tmp_path_factory.mktemp("dp-warm")
    out, cache = root / "warm", root / "presets"
    subprocess.run(
        [*CLI, "sft", "--preset", "llama-char", "--regime", "short", "--steps", "25",
         "--batch", "16", "--lr", "3e-3", "--eval-every", "0", "--seed", "3",
         "--cache-dir", str(cache), "--out", str(out), "--no-progress"],
        check=True, env=_env(), capture_output=True, timeout=400)
    return out, cache


def _config(root: Path, warm: tuple[Path, Path], rounds: int = ROUNDS, **grpo: Any) -> Path:
    out = root / "out"
    shutil.copytree(warm[1], out / "presets", dirs_exist_ok=True)
    cfg = {"trainer": {
        "run_id": "dp", "output_dir": str(out), "seed": 3,
        "task": {"regime": "short", "format_reward": 0.5},
        "grpo": {"group_size": 4, "prompts_per_round": 4, "rounds": rounds, "lr": 1e-3,
                 "max_new_tokens": 12, **grpo},
        "eval": {"every": 0}, "checkpoint": {"every": 1, "keep": 2},
        "metrics": {"progress": False}, "services": {"local": True},
        "policies": [{"name": "A", "preset": "llama-char", "sft_checkpoint": str(warm[0])}],
    }}
    path = root / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train(cfg: Path, *args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*CLI, "train", "-c", str(cfg), *args], env=_env(), text=True,
                          capture_output=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _ckpts(root: Path) -> Path:
    return root / "out" / "dp" / "A" / "checkpoints"


def _weights(ckpt: Path) -> dict[str, Any]:
    """The policy's parameters in a checkpoint of either layout."""
    import torch
    from safetensors.torch import load_file

    if (ckpt / "policy" / "model.safetensors").exists():
        return load_file(ckpt / "policy" / "model.safetensors")
    state = torch.load(ckpt / "state.pt", map_location="cpu", weights_only=False)
    return dict(state["model"])


def _max_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert set(a) == set(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _rows(root: Path) -> list[dict[str, float]]:
    path = root / "out" / "dp" / "A" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@pytest.fixture(scope="module")
def runs(warm: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
         ) -> dict[int, Path]:
    """The same 3 rounds trained by 1 process and by 2 ranks."""
    roots = {}
    for n in (1, 2):
        root = tmp_path_factory.mktemp(f"dp-n{n}")
        _train(_config(root, warm), "--nproc", str(n))
        roots[n] = root
    return roots


def test_two_ranks_train_what_one_process_trains(runs: dict[int, Path]) -> None:
    one, two = _rows(runs[1]), _rows(runs[2])
    assert [r["round"] for r in two] == list(range(ROUNDS))
    # The same samples (per-prompt seeds), so the same rewards and token counts ...
    for a, b in zip(one, two, strict=True):
        assert a["reward_mean"] == b["reward_mean"]
        assert a["tokens"] == b["tokens"]
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    assert any(r["grad_norm"] > 0.1 for r in one), "no gradient: the test would prove nothing"
    # ... and the same step: the sharded update equals the one-process update.
    final = f"round-{ROUNDS:06d}"
    w1, w2 = _weights(_ckpts(runs[1]) / final), _weights(_ckpts(runs[2]) / final)
    start = _weights(_ckpts(runs[1]) / f"round-{ROUNDS - 1:06d}")
    assert _max_diff(w1, start) > 20 * ATOL  # the last step moved the weights (by ~lr)
    assert _max_diff(w1, w2) <= ATOL
    # The 2-rank checkpoint is DCP shards plus a plain save_pretrained policy.
    ck2 = _ckpts(runs[2]) / final
    assert sorted(p.name for p in (ck2 / "dcp").glob("*.distcp")) == ["__0_0.distcp",
                                                                      "__1_0.distcp"]


@pytest.mark.parametrize(("written_by", "resumed_on"), [(2, 1), (1, 2)])
def test_resume_with_a_different_number_of_ranks(
    runs: dict[int, Path], warm: tuple[Path, Path], tmp_path: Path, written_by: int,
    resumed_on: int,
) -> None:
    cfg = _config(tmp_path, warm)
    # Round 2's checkpoint of the run with `written_by` ranks, as if it had stopped there.
    src = _ckpts(runs[written_by])
    shutil.copytree(src / f"round-{ROUNDS - 1:06d}", _ckpts(tmp_path) / f"round-{ROUNDS - 1:06d}")
    proc = _train(cfg, "--nproc", str(resumed_on), "--resume")
    assert f"round-{ROUNDS - 1:06d} (round {ROUNDS - 1})" in proc.stderr
    resumed = _weights(_ckpts(tmp_path) / f"round-{ROUNDS:06d}")
    straight = _weights(_ckpts(runs[1]) / f"round-{ROUNDS:06d}")
    assert _max_diff(resumed, straight) <= ATOL


def _rank_pids(launcher: int) -> dict[int, int]:
    """rank -> pid of the workers the elastic launcher `launcher` started."""
    import psutil

    out = {}
    for child in psutil.Process(launcher).children(recursive=True):
        try:
            env = child.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if "TORCHELASTIC_RUN_ID" in env and "RANK" in env:
            out[int(env["RANK"])] = child.pid
    return out


def _wait_rows(path: Path, n: int, child: Any, log: Path, within: float = 120) -> None:
    deadline = time.monotonic() + within
    while not (path.exists() and len(path.read_text().splitlines()) >= n):
        assert child.proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"fewer than {n} rounds after {within}s"
        time.sleep(0.05)


def test_a_dead_rank_brings_the_policy_down_and_the_supervisor_resumes_it(
    warm: tuple[Path, Path], tmp_path: Path,
) -> None:
    from mutualrl.launch.supervisor import ProcessSpec, Restart, Supervisor

    rounds = 40  # more than it gets to: a SIGTERM ends it
    cfg = _config(tmp_path, warm, rounds=rounds, max_new_tokens=24)
    log_path = tmp_path / "trainer-A.log"
    sup = Supervisor(log=lambda _: None)
    spec = ProcessSpec(name="trainer-A", argv=[*CLI, "train", "-c", str(cfg), "--nproc", "2"],
                       log_path=log_path, env=_env(),
                       restart=Restart.ON_FAILURE, max_restarts=1, finishes=True)
    child = sup.start(spec)
    try:
        metrics = tmp_path / "out" / "dp" / "A" / "metrics.jsonl"
        _wait_rows(metrics, 2, child, log_path)
        ranks = _rank_pids(child.pid)
        assert sorted(ranks) == [0, 1]
        os.kill(ranks[1], signal.SIGKILL)
        killed = time.monotonic()
        code = child.proc.wait(timeout=KILL_BOUND_S)  # no hang: down within the bound
        assert code != 0
        assert time.monotonic() - killed < KILL_BOUND_S
        # No rank outlives its policy.
        for pid in ranks.values():
            assert not Path(f"/proc/{pid}").exists() or \
                Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
        exited = sup.poll()
        assert [(c.spec.name, c2) for c, c2 in exited] == [("trainer-A", code)]
        last = sorted(p.name for p in _ckpts(tmp_path).glob("round-*"))[-1]
        done_before = int(last.removeprefix("round-"))
        assert 1 <= done_before < rounds

        fresh = sup.restart(child)
        assert "--resume" in fresh.spec.argv
        _wait_rows(metrics, done_before + 2, fresh, log_path)
        codes = sup.stop_all(grace=60)  # SIGTERM: finish the round, checkpoint, exit 0
        assert codes == {"trainer-A": 0}, log_path.read_text()[-3000:]
    finally:
        sup.stop_all(grace=10)
    log = log_path.read_text()
    assert f"resumed A from {_ckpts(tmp_path) / last} (round {done_before})" in log
    rows = _rows(tmp_path)
    n = len(rows)
    assert [r["round"] for r in rows] == list(range(n))  # each round logged once
    assert done_before + 2 <= n < rounds
    # Both ranks stopped after round n, which is checkpointed.
    assert checkpoint_round(_ckpts(tmp_path)) == n
    assert (_ckpts(tmp_path) / f"round-{n:06d}" / "dcp").is_dir()


def checkpoint_round(ckpts: Path) -> int:
    return int(sorted(p.name for p in ckpts.glob("round-*"))[-1].removeprefix("round-"))

def _nodes_config(root: Path, warm: tuple[Path, Path], **policy: Any) -> Path:
    path = _config(root, warm)
    cfg = yaml.safe_load(path.read_text())
    cfg["trainer"]["policies"][0].update(nnodes=2, **policy)
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train_nodes(cfg: Path, *args: str, timeout: float = 480) -> list[str]:
    """Both nodes' launchers, started together; asserts each exits 0, returns their logs
    (files, not pipes: a pipe nobody reads while waiting on the other node fills and blocks
    that node's ranks, and with them the collectives of both)."""
    endpoint = f"127.0.0.1:{free_port()}"
    logs = [cfg.parent / f"node{k}.log" for k in (1, 0)]
    procs = []
    for k, log in zip((1, 0), logs, strict=True):  # node 1 first: it waits for node 0's store
        with log.open("w") as fh:
            procs.append(subprocess.Popen(
                [*CLI, "train", "-c", str(cfg), "--node-rank", str(k), "--rdzv-endpoint",
                 endpoint, *args], env=_env(), stdout=subprocess.DEVNULL, stderr=fh))
    deadline = time.monotonic() + timeout
    try:
        for proc, log in zip(procs, logs, strict=True):
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            assert code == 0, log.read_text()[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return [log.read_text() for log in logs]


@pytest.fixture(scope="module")
def two_nodes(warm: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
              ) -> dict[str, Path]:
    """The same 3 rounds on 2 nodes x 1 rank, sharded (fsdp) and replicated (hsdp)."""
    roots = {}
    for sharding in ("fsdp", "hsdp"):
        root = tmp_path_factory.mktemp(f"nodes-{sharding}")
        _train_nodes(_nodes_config(root, warm, sharding=sharding))
        roots[sharding] = root
    return roots


@pytest.mark.timeout(1800)  # the 1-node and 2-node runs it compares
@pytest.mark.parametrize("sharding", ["fsdp", "hsdp"])
def test_two_nodes_train_what_two_ranks_of_one_node_train(
    runs: dict[int, Path], two_nodes: dict[str, Path], sharding: str,
) -> None:
    one_node, nodes = _rows(runs[2]), _rows(two_nodes[sharding])
    assert [r["round"] for r in nodes] == list(range(ROUNDS))  # rank 0 of both nodes logs
    for a, b in zip(one_node, nodes, strict=True):
        assert a["reward_mean"] == b["reward_mean"]  # the same samples (per-prompt seeds)
        assert a["tokens"] == b["tokens"]
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)
    final = f"round-{ROUNDS:06d}"
    w_nodes = _weights(_ckpts(two_nodes[sharding]) / final)
    assert _max_diff(_weights(_ckpts(runs[2]) / final), w_nodes) <= ATOL
    assert _max_diff(_weights(_ckpts(runs[1]) / final), w_nodes) <= ATOL
    manifest = yaml.safe_load((_ckpts(two_nodes[sharding]) / final / "checkpoint.json")
                              .read_text())
    assert manifest["world"] == 2 and manifest["dcp"] is True


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("written_by", "resumed_on"), [("nodes", "one"), ("one", "nodes")])
def test_resume_across_world_sizes(
    runs: dict[int, Path], two_nodes: dict[str, Path], warm: tuple[Path, Path],
    tmp_path: Path, written_by: str, resumed_on: str,
) -> None:
    src = _ckpts(two_nodes["fsdp"] if written_by == "nodes" else runs[1])
    last = f"round-{ROUNDS - 1:06d}"
    cfg = _nodes_config(tmp_path, warm)  # the same run, as a 2-node policy
    shutil.copytree(src / last, _ckpts(tmp_path) / last)
    if resumed_on == "nodes":
        logs = "".join(_train_nodes(cfg, "--resume"))
    else:
        proc = subprocess.run([*CLI, "train", "-c", str(cfg), "--nnodes", "1", "--resume"],
                              env=_env(), text=True, capture_output=True, timeout=180)
        assert proc.returncode == 0, proc.stderr[-3000:]
        logs = proc.stderr
    assert f"{last} (round {ROUNDS - 1})" in logs
    resumed = _weights(_ckpts(tmp_path) / f"round-{ROUNDS:06d}")
    straight = _weights(_ckpts(runs[1]) / f"round-{ROUNDS:06d}")
    assert _max_diff(resumed, straight) <= ATOL
    written = yaml.safe_load((_ckpts(tmp_path) / f"round-{ROUNDS:06d}" / "checkpoint.json")
                             .read_text())
    assert written.get("world", 1) == (2 if resumed_on == "nodes" else 1)


@pytest.mark.parametrize(("args", "message"), [
    ((), "nnodes 2 needs rdzv_endpoint (or --rdzv-endpoint)"),
    (("--node-rank", "2", "--rdzv-endpoint", "127.0.0.1:29400"), "--node-rank 2: one of 0..1"),
    (("--rdzv-endpoint", "node0"), "--rdzv-endpoint 'node0': not host:port"),
])
def test_a_launch_across_nodes_without_its_rendezvous_is_refused(
    warm: tuple[Path, Path], tmp_path: Path, args: tuple[str, ...], message: str,
) -> None:
    cfg = _nodes_config(tmp_path, warm)
    proc = subprocess.run([*CLI, "train", "-c", str(cfg), *args], env=_env(), text=True,
                          capture_output=True, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr
    assert not _ckpts(tmp_path).exists()


def test_the_endpoint_in_the_run_file_is_checked(warm: tuple[Path, Path],
                                                 tmp_path: Path) -> None:
    cfg = _nodes_config(tmp_path, warm, rdzv_endpoint="node0:http")
    proc = subprocess.run([*CLI, "train", "-c", str(cfg)], env=_env(), text=True,
                          capture_output=True, timeout=60)
    assert proc.returncode == 2
    assert "rdzv_endpoint 'node0:http' is not host:port" in proc.stderr
