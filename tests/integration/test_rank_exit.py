"""How a data-parallel rank ends (`distributed.shutdown`, `distributed.exit_rank`): a clean end
collects the sharded model (whose device mesh holds the process group) before the group is
destroyed, and the rank leaves with its exit code and its output flushed. A failed end tries
nothing collective.

Run as a script, this file is one rank of a world of 1 over gloo (the test starts it).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)


def _main() -> None:
    import gc

    import torch
    from torch.distributed.fsdp import FSDPModule

    from mutualrl.trainer.runtime import distributed

    clean = sys.argv[1] == "clean"
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    distributed.shard(model)
    model.__dict__["cycle"] = [model]  # a reference cycle, as module graphs have
    model(torch.ones(1, 4)).sum().backward()
    del model
    alive = sum(isinstance(o, FSDPModule) for o in gc.get_objects())
    distributed.shutdown(clean=clean)
    left = sum(isinstance(o, FSDPModule) for o in gc.get_objects())
    print(f"sharded before {alive} after {left} group {torch.distributed.is_initialized()}",
          end="")  # no newline: exit_rank must flush it
    distributed.exit_rank(7 if clean else 3)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(mode: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, __file__, mode], env=env, capture_output=True,
                          text=True, timeout=100)


def test_a_clean_end_collects_the_sharded_model_then_leaves_the_group() -> None:
    proc = _rank("clean")
    assert proc.returncode == 7, proc.stderr[-3000:]
    assert proc.stdout == "sharded before 1 after 0 group False", proc.stderr[-3000:]


def test_a_failed_end_leaves_the_group_to_the_launcher() -> None:
    proc = _rank("failed")
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert proc.stdout == "sharded before 1 after 1 group True", proc.stderr[-3000:]


if __name__ == "__main__":
    _main()
