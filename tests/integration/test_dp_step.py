"""The data-parallel step (`step.optimise` with a `Dist`) on 2 real gloo ranks with FSDP2, for
the probes whose rows are not plain own samples: PRP's peer rows (chunk weights) and SGT's
demonstrations (per-prompt averaging), with 2 mini-batches (the clip acts) and a KL reference.
Each rank scores its block of every mini-batch with the whole mini-batch's coefficients; the
sharded weights after the round must equal one process's (float64, up to reduction order).

Run as a script, this file is one rank (the test starts two).
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(180)

CASES = [("prp", "chunk"), ("sgt", "sequence"), ("sgt-self", "sequence")]
ATOL = 1e-12
"""float64 weights after one round of 2 AdamW steps (lr 1e-3): only the order of sums differs."""


def _helpers() -> Any:
    """tests/unit/test_micro_batch.py: its tiny model and fixed round with each probe's plan."""
    name = "micro_batch_cases"
    if name not in sys.modules:  # dataclasses look their module up while it loads
        tests = Path(__file__).resolve().parents[1]
        if str(tests) not in sys.path:  # the ranks run outside pytest (its pythonpath setting)
            sys.path.insert(0, str(tests))
        path = tests / "unit" / "test_micro_batch.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def train_round(kind: str, level: str, dist: Any) -> dict[str, Any]:
    """Weights (whole, on rank 0) and stats after one round of `kind` on a fresh tiny model."""
    import torch

    from mutualrl.trainer.config.run import GRPOSettings, ProbeSettings
    from mutualrl.trainer.runtime.distributed import full_state_dict, shard
    from mutualrl.trainer.runtime.step import StepSettings, optimise

    h = _helpers()
    probe = ProbeSettings(kind=kind, prp_level=level, prp_weight_mode="truncate", prp_cap=3.0,
                          sgt_lambda=0.7)
    grpo = GRPOSettings(beta=0.05, mini_batches=2, micro_batch_tokens=16, logit_chunk_tokens=3,
                        lr=1e-3)
    model, ref = h.tiny_model(), h.tiny_model(seed=1)
    if dist.active:
        shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=grpo.lr)
    out = optimise(model, ref, opt, h.PROMPT_IDS, h.fixed_round(), h.plan_for(kind, level),
                   StepSettings.of(grpo, probe, h.PAD, h.MAX_LEN, dist))
    weights = full_state_dict(model) if dist.active else model.state_dict()
    return {"weights": weights, "stats": out.stats}


def _main() -> None:
    import torch

    from mutualrl.trainer.runtime.distributed import Dist

    rank, world, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    dist = Dist(rank, world)
    results = {f"{k}-{lv}": train_round(k, lv, dist) for k, lv in CASES}
    if dist.main:
        torch.save(results, out)
    # Both ranks done before either tears the group down: rank 0 hosts the store here, and a
    # rank leaving while its peer was still in the group aborted it 1 run in 6.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_ranks_take_one_process_step_for_peer_rows_and_demos(tmp_path: Path) -> None:
    import torch

    from mutualrl.trainer.runtime.distributed import SINGLE

    out = tmp_path / "ranks.pt"
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, __file__, str(r), "2", str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(2)]
    logs = [p.communicate(timeout=150)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(x[-3000:] for x in logs)
    ranks = torch.load(out, weights_only=False)
    for kind, level in CASES:
        one = train_round(kind, level, SINGLE)
        two = ranks[f"{kind}-{level}"]
        start = _helpers().tiny_model().state_dict()
        moved = max(float((one["weights"][k] - start[k]).abs().max()) for k in two["weights"])
        assert moved > 1e-5, kind  # the round changed the weights
        diff = max(float((one["weights"][k] - two["weights"][k]).abs().max())
                   for k in two["weights"])
        assert diff <= ATOL, (kind, diff)
        for key in ("loss", "loss_pg", "loss_sgt", "clip_frac", "tokens", "updates"):
            assert two["stats"][key] == pytest.approx(one["stats"][key], rel=1e-9, abs=1e-12), \
                (kind, key, json.dumps({k: (one["stats"][k], two["stats"][k])
                                        for k in one["stats"] if k in two["stats"]}))


if __name__ == "__main__":
    _main()
