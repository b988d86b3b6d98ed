"""Data parallel for one policy: N processes (ranks) over torch.distributed train one policy.

- Launch: `mutualrl train --nproc N` (or `PolicySettings.nproc`) starts N workers through
  torchrun's elastic launcher with `max_restarts=0`: a rank that dies takes the whole policy
  down (the launcher exits non-zero) and whoever supervises it restarts it with `--resume`.
  Across machines (`nnodes`), one launcher per node joins the policy's c10d rendezvous (node
  0 serves it at `rdzv_endpoint`); a node that dies ends the rendezvous for all of them.
- Parameters, gradients and optimizer state are sharded with FSDP2 (`fully_shard`), gloo on
  CPU, NCCL on CUDA: over every rank, or (`sharding: hsdp`) over a node's ranks and
  replicated across nodes on a 2-D device mesh.
- Rollouts: each rank samples a contiguous block of the round's prompts (all G samples of a
  prompt on one rank, so groups stay whole) with per-prompt seeds, so the samples do not
  depend on N. For sampling the parameters are gathered once (`gathered`) and each rank's
  forwards are local: ranks stop at different times without waiting for each other.
- Rank 0 alone talks to MWRA and SEE/THL and broadcasts the allocation and the probe's plan.
- The loss uses the mini-batch's global denominators (`step.coefficients`); each rank backpropagates
  `world x` its share, and FSDP's mean over ranks turns that into the sum: N ranks take the
  step one process would.

With one process every helper here is the identity (`SINGLE`), so the loop has one code path.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn, TypeVar

import torch
from torch import Tensor

T = TypeVar("T")

COLLECTIVE_TIMEOUT_S = 600.0
"""How long a collective waits for a silent rank before failing (gloo/NCCL timeout). A rank
that dies closes its sockets and the others fail at once; this bounds a rank that hangs."""


@dataclass(frozen=True)
class Dist:
    """This process's place among the ranks of one policy."""

    rank: int = 0
    world: int = 1
    nodes: int = 1
    """Machines the ranks run on (`world // nodes` on each, consecutive ranks per node)."""

    @property
    def main(self) -> bool:
        """Rank 0: the one that talks to the services, logs metrics and writes extras."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def from_main(self, make: Callable[[], T]) -> T:
        """`make()` run on rank 0 alone, its result on every rank (a picklable object)."""
        if not self.active:
            return make()
        box: list[Any] = [make() if self.main else None]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather(self, obj: T) -> list[T]:
        """Every rank's `obj`, in rank order."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def sum(self, t: Tensor) -> Tensor:
        """Elementwise sum over ranks (a new tensor; float64 on CPU for a fixed rounding)."""
        if not self.active:
            return t
        buf = t.detach().to("cpu", torch.float64).clone()
        torch.distributed.all_reduce(buf)
        return buf.to(t.device, t.dtype)

    def any(self, flag: bool) -> bool:
        """True on every rank when it is true on some rank."""
        if not self.active:
            return flag
        return bool(self.sum(torch.tensor([float(flag)])) > 0)

    def block(self, n: int) -> range:
        """This rank's contiguous share of `n` items (the first `n % world` ranks get one more)."""
        return block(n, self.rank, self.world)

    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()


SINGLE = Dist()


def block(n: int, rank: int, world: int) -> range:
    """Contiguous share `rank` of `n` items split over `world` ranks, in order."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (rank < extra))


def launched() -> bool:
    """True in a worker started by torchrun / the elastic launcher."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ


def backend_for(device: str) -> str:
    """NCCL for CUDA policies, gloo for CPU ones."""
    return "nccl" if device.startswith("cuda") else "gloo"


def init(device: str) -> tuple[Dist, str]:
    """Join the process group of a launched worker; (its Dist, the device it trains on)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    _die_with_agent()
    if device.startswith("cuda"):
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = f"cuda:{local}"
        torch.cuda.set_device(local)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(
            backend_for(device), timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    return Dist(rank, world, max(1, world // max(local_world, 1))), device


def _die_with_agent() -> None:
    """A rank ends with its node's launcher (as a machine that fails takes both): the launcher
    starts each rank in a session of its own, so a killed launcher would otherwise leave its
    ranks holding their peers' connections, and the survivors would wait out the collective
    timeout instead of failing at once. A launcher that stops cleanly waits for its ranks."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() == 1:  # the launcher died before the line above took effect
            os._exit(1)


def shutdown(clean: bool = True) -> None:
    """Leave the process group. `clean` (every rank finished the same work): the ranks meet at
    a barrier first, as a rank tearing its group down while a peer is still in it can abort;
    and the sharded model, whose device mesh holds the group, is collected first (a module
    graph is a reference cycle), so the group's worker threads end here and not in interpreter
    finalization, where gloo freeing a tensor under a vanishing GIL aborts the process. Not
    clean (this rank failed): nothing collective is tried, the launcher stops the others."""
    if clean and torch.distributed.is_initialized():
        gc.collect()
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def exit_rank(code: int) -> NoReturn:
    """End a launched rank once its work is saved and its process group left: output flushed,
    then out without interpreter finalization, whose teardown of torch's C++ state (threads,
    tensors freed under a vanishing GIL) can abort a rank that finished cleanly."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def shard(model: torch.nn.Module, compute: torch.dtype | None = None,
          replicas: int = 1) -> torch.nn.Module:
    """FSDP2 over `model`: each decoder block is its own unit, the root holds the rest
    (embeddings and a tied LM head stay together there). `compute` (mixed precision): the
    gathered parameters are cast to it for forward and backward, gradients are reduced in
    float32 into the float32 shards the optimizer steps. `replicas` > 1 (HSDP): the ranks
    form a (replicas, world / replicas) mesh, each row (a node's consecutive ranks) holds one
    sharded copy, and gradients are reduce-scattered in the row, then all-reduced down the
    columns: the mean over every rank, as with one shard group."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kw: dict[str, Any] = {}
    if compute is not None:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
    if replicas > 1:
        world = torch.distributed.get_world_size()
        if world % replicas:
            raise ValueError(f"HSDP: {world} ranks do not split into {replicas} replicas")
        device_type = next(model.parameters()).device.type
        kw["mesh"] = init_device_mesh(device_type, (replicas, world // replicas),
                                      mesh_dim_names=("replicate", "shard"))
    for block_ in _blocks(model):
        fully_shard(block_, **kw)
    fully_shard(model, **kw)
    return model


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face causal LM (the repeated ModuleList)."""
    layers = getattr(getattr(model, "model", None), "layers", None)  # Llama, Qwen2, ...
    if layers is None:
        layers = getattr(getattr(model, "transformer", None), "h", None)  # GPT-2
    return list(layers) if layers is not None else []


def _fsdp_units(model: torch.nn.Module) -> list[Any]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextmanager
def gathered(model: torch.nn.Module) -> Iterator[None]:
    """Full parameters on every rank for the duration (all ranks enter together); inside, a
    forward pass is local, so ranks may run different numbers of them (sampling, evaluation).
    A no-op for a model that is not sharded."""
    units = _fsdp_units(model)
    # The root keeps its parameters after forward anyway (FSDP2's default for the root, which
    # the chunked LM head relies on): only the inner units change, and change back.
    inner = [u for u in units if u is not model]
    for u in units:
        u.unshard()
    for u in inner:
        u.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for u in units:
            u.reshard()
        for u in inner:
            u.set_reshard_after_forward(True, recurse=False)


def full_state_dict(model: torch.nn.Module) -> dict[str, Tensor]:
    """The whole model's state on rank 0 (CPU), empty on the others (collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v for k, v in state.items() if isinstance(v, Tensor)}


RDZV_TIMEOUT_S = 900
"""How long a node waits for the other nodes of its policy to join the rendezvous."""


@dataclass(frozen=True)
class Nodes:
    """Where this launcher stands among the machines of one policy."""

    nnodes: int = 1
    node_rank: int = 0
    """0: this node serves the rendezvous (its TCP store) at `endpoint`; the others join it.
    The ranks themselves are numbered by the rendezvous, `nproc` consecutive ones a node."""
    endpoint: str = "127.0.0.1:0"
    """host:port of the rendezvous (port 0: a free one, for one node)."""


ONE_NODE = Nodes()


def launch(nproc: int, argv: Sequence[str], run_id: str, nodes: Nodes = ONE_NODE) -> int:
    """Run `python -m mutualrl.cli <argv>` as `nproc` workers under the elastic launcher, on
    this node of `nodes` (torchrun's c10d rendezvous, exactly `nnodes` nodes); 0 when every
    worker succeeded, 1 when one failed here or on another node (the others are stopped, no
    restart)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    cfg = LaunchConfig(
        min_nodes=nodes.nnodes, max_nodes=nodes.nnodes, nproc_per_node=nproc, run_id=run_id,
        rdzv_backend="c10d", rdzv_endpoint=nodes.endpoint, max_restarts=0,
        # Node 0 serves the store: one launcher per machine, never guessed from host names
        # (two nodes on one machine are both the endpoint's host).
        rdzv_configs={"is_host": nodes.node_rank == 0, "join_timeout": RDZV_TIMEOUT_S},
        monitor_interval=0.5, start_method="spawn",
        # Survivors of a dead rank get SIGTERM, then SIGKILL after this: they finish a round
        # and checkpoint on a plain stop, and fail at once on a dead peer's closed socket.
        shutdown_timeout=60)
    try:
        elastic_launch(cfg, sys.executable)("-m", "mutualrl.cli", *argv)
    except ChildFailedError as err:
        for rank, failure in err.failures.items():
            print(f"rank {rank} failed: exit code {failure.exitcode}", file=sys.stderr)
        return 1
    except RendezvousError as err:  # a node left, or never came
        print(f"rendezvous {run_id} at {nodes.endpoint} failed: {err}", file=sys.stderr)
        return 1
    except SignalException as err:
        # The launcher passed the signal on; the ranks finished their round, checkpointed it
        # and exited (as one process does on SIGTERM).
        print(f"stopped by signal {err.sigval}", file=sys.stderr)
    return 0
