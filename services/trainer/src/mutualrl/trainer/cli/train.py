"""`mutualrl train -c FILE [--policy NAME] [--resume] [--rounds N] [--nproc N] [--nnodes N]
[--node-rank K] [--rdzv-endpoint HOST:PORT] [--dry-run]`: train one policy of a run in this
process, as a rank of the elastic launcher, or launch its ranks on this node (of `nnodes`);
`--dry-run` prints every policy's memory plan instead."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from types import FrameType

from pydantic import ValidationError

from mutualrl.common.config import load_yaml
from mutualrl.trainer.cli.dry_run import memory_plans
from mutualrl.trainer.config.run import (
    PolicySettings,
    TrainerConfig,
    first_error,
    is_endpoint,
    load_trainer_config,
)
from mutualrl.trainer.data.dataset_task import ExperimentInputError
from mutualrl.trainer.runtime import distributed
from mutualrl.trainer.runtime.distributed import Dist
from mutualrl.trainer.runtime.loop import train
from mutualrl.trainer.runtime.memory import RolloutMemoryError, set_allocator
from mutualrl.trainer.runtime.session import build_session

log = logging.getLogger(__name__)


def _load(args: argparse.Namespace, command: str) -> TrainerConfig | None:
    """The run file's trainer section with the command line's --rounds and --nproc, validated
    together (None: the error, naming its field, is printed)."""
    try:
        return load_trainer_config(args.config, rounds=args.rounds, nproc=args.nproc,
                                   nnodes=args.nnodes)
    except ValidationError as err:
        print(f"mutualrl {command}: config {args.config}: {first_error(err)}", file=sys.stderr)
    except ValueError as err:  # e.g. an environment variable naming no field
        print(f"mutualrl {command}: config {args.config}: {err}", file=sys.stderr)
    return None


def run(args: argparse.Namespace) -> int:
    if args.dry_run:
        return dry_run(args)
    set_allocator()  # before anything touches CUDA
    cfg = _load(args, "train")
    if cfg is None:
        return 2
    try:
        policy = cfg.policy(args.policy)
    except ValueError as err:  # no --policy among several, or one the run does not have
        print(f"mutualrl train: {err}", file=sys.stderr)
        return 2
    dist, device = distributed.SINGLE, None
    if distributed.launched():  # a rank started by the elastic launcher (or torchrun)
        dist, device = distributed.init(policy.device)
    elif policy.ranks > 1:
        nodes = _nodes(args, policy)
        if nodes is None:
            return 2
        argv = ["train", "-c", str(args.config), "--policy", policy.name]
        argv += ["--resume"] if args.resume else []
        argv += ["--rounds", str(args.rounds)] if args.rounds is not None else []
        argv += ["--nproc", str(args.nproc)] if args.nproc is not None else []
        argv += ["--nnodes", str(args.nnodes)] if args.nnodes is not None else []
        return distributed.launch(policy.nproc, argv, f"{cfg.run_id}-{policy.name}", nodes)
    code = 1  # until training returns
    try:
        code = train_here(cfg, policy.name, args.resume, dist, device)
    except (*ExperimentInputError, RolloutMemoryError) as err:  # named in the message
        print(f"mutualrl train: {err}", file=sys.stderr)
        code = 2
    finally:
        distributed.shutdown(clean=code == 0)
    if dist.active:
        distributed.exit_rank(code)
    return code


def _nodes(args: argparse.Namespace, policy: PolicySettings) -> distributed.Nodes | None:
    """This launcher's place among the policy's nodes: `--node-rank` (else MUTUALRL_NODE_RANK,
    else 0) and the rendezvous endpoint (`--rdzv-endpoint`, else MUTUALRL_RDZV_ENDPOINT, else
    `rdzv_endpoint`); None when they are wrong (the error, naming the field, is printed)."""
    if policy.nnodes == 1:
        return distributed.ONE_NODE
    rank_text = args.node_rank if args.node_rank is not None else \
        os.environ.get("MUTUALRL_NODE_RANK") or "0"
    endpoint = args.rdzv_endpoint or os.environ.get("MUTUALRL_RDZV_ENDPOINT") \
        or policy.rdzv_endpoint
    problem = None
    if not str(rank_text).isdigit() or not 0 <= int(rank_text) < policy.nnodes:
        problem = (f"--node-rank {rank_text}: one of 0..{policy.nnodes - 1} "
                   f"(policy {policy.name} runs on nnodes {policy.nnodes})")
    elif endpoint is None:
        problem = (f"policy {policy.name}: nnodes {policy.nnodes} needs rdzv_endpoint (or "
                   "--rdzv-endpoint): host:port of node 0, which serves the rendezvous")
    elif not is_endpoint(endpoint):
        problem = f"--rdzv-endpoint {endpoint!r}: not host:port"
    if problem is not None:
        print(f"mutualrl train: {problem}", file=sys.stderr)
        return None
    assert endpoint is not None
    return distributed.Nodes(policy.nnodes, int(rank_text), endpoint)


def train_here(cfg: TrainerConfig, policy: str, resume: bool, dist: Dist,
               device: str | None) -> int:
    """Train `policy` in this process: alone, or as one rank of `dist`."""
    session = build_session(cfg, policy, resume=resume, dist=dist, device=device)
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        # Finish the round in flight, checkpoint it, then exit: SIGTERM loses no round.
        log.warning("%s: stopping after this round", signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, request_stop)
    try:
        train(session, stop_requested=stop.is_set)
    finally:
        session.close()
    return 0


def dry_run(args: argparse.Namespace) -> int:
    raw = load_yaml(args.config)
    if "trainer" not in raw and "experiment" in raw:
        print(f"mutualrl train --dry-run: {args.config} is an experiment file; "
              f"`mutualrl experiment -c {args.config} --dry-run` plans each regime's policies",
              file=sys.stderr)
        return 2
    cfg = _load(args, "train --dry-run")  # --nproc: one rank's plan, as train would run it
    if cfg is None:
        return 2
    try:
        plans = memory_plans(cfg, [args.policy] if args.policy else None,
                             args.device_memory_gb, args.prompt_tokens)
    except (ValueError, OSError) as e:
        print(f"mutualrl train --dry-run: {e}", file=sys.stderr)
        return 2
    print("\n".join(p.text for p in plans))
    bad = [p for p in plans if not p.plan.fits]
    for p in bad:
        print(f"mutualrl train --dry-run: policy {p.policy} does not fit: "
              + "; ".join(p.plan.problems), file=sys.stderr)
    return 2 if bad else 0
