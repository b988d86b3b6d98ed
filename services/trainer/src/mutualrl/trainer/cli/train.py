"""`mutualrl train` and `mutualrl create-run` (registered from mutualrl.trainer.cli.main)."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch and pydantic stay out of `mutualrl --help`
    from mutualrl.trainer.config.run import TrainerConfig
    from mutualrl.trainer.runtime.distributed import Dist

log = logging.getLogger(__name__)


def _train(args: argparse.Namespace) -> int:
    import sys

    from mutualrl.trainer.config.run import load_trainer_config
    from mutualrl.trainer.data.dataset_task import ExperimentInputError
    from mutualrl.trainer.runtime import distributed

    if args.dry_run:
        return _dry_run(args)
    try:
        cfg = load_trainer_config(args.config)
    except ValueError as err:  # pydantic's ValidationError too: it names the field
        print(f"mutualrl train: config {args.config}: {err}", file=sys.stderr)
        return 2
    if args.rounds is not None:
        cfg.grpo.rounds = args.rounds
    policy = cfg.policy(args.policy)
    nproc = args.nproc if args.nproc is not None else policy.nproc
    dist, device = distributed.SINGLE, None
    if distributed.launched():  # a rank started by the elastic launcher (or torchrun)
        dist, device = distributed.init(policy.device)
    elif nproc > 1:
        argv = ["train", "-c", str(args.config), "--policy", policy.name]
        argv += ["--resume"] if args.resume else []
        argv += ["--rounds", str(args.rounds)] if args.rounds is not None else []
        return distributed.launch(nproc, argv, f"{cfg.run_id}-{policy.name}")
    code = 1  # until training returns
    try:
        code = _train_here(cfg, policy.name, args.resume, dist, device)
    except ExperimentInputError as err:  # named in the message: no traceback needed
        print(f"mutualrl train: {err}", file=sys.stderr)
        code = 2
    finally:
        distributed.shutdown(clean=code == 0)
    if dist.active:
        distributed.exit_rank(code)
    return code


def _train_here(cfg: TrainerConfig, policy: str, resume: bool, dist: Dist,
                device: str | None) -> int:
    """Train `policy` in this process: alone, or as one rank of `dist`."""
    from mutualrl.trainer.runtime.loop import train
    from mutualrl.trainer.runtime.session import build_session

    session = build_session(cfg, policy, resume=resume, dist=dist, device=device)
    stop = threading.Event()

    def request_stop(signum: int, frame: Any) -> None:
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


def _dry_run(args: argparse.Namespace) -> int:
    import sys

    from mutualrl.common.config import load_yaml
    from mutualrl.trainer.cli.dry_run import memory_plans
    from mutualrl.trainer.config.run import load_trainer_config

    raw = load_yaml(args.config)
    if "trainer" not in raw and "experiment" in raw:
        print(f"mutualrl train --dry-run: {args.config} is an experiment file; "
              f"`mutualrl experiment -c {args.config} --dry-run` plans each regime's policies",
              file=sys.stderr)
        return 2
    cfg = load_trainer_config(args.config)
    if args.nproc is not None:  # one rank's plan, as `train --nproc` would run it
        for policy in cfg.policies:
            policy.nproc = args.nproc
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


def _create_run(args: argparse.Namespace) -> int:
    """Create the config's run in SEE with the run's secret (MUTUALRL_AUTH_TOKEN), as
    trainers holding a policy token may not (`mutualrl.see.grpc.access`); idempotent."""
    import sys

    import grpc

    from mutualrl.client.see import SeeClient
    from mutualrl.common.channel import ClientOptions
    from mutualrl.trainer.config.run import load_trainer_config

    cfg = load_trainer_config(args.config)
    svc = cfg.services
    policies = [p.name for p in cfg.policies]
    client = SeeClient(ClientOptions(address=svc.see, token=svc.token, timeout=svc.timeout))
    try:
        client.create_run(cfg.run_id, policies, cfg.probe.tau, exist_ok=True)
    except grpc.RpcError as err:
        print(f"mutualrl create-run: run {cfg.run_id} at {svc.see}: {err.code().name}: "
              f"{err.details()}", file=sys.stderr)
        return 1
    finally:
        client.close()
    print(f"run {cfg.run_id} in SEE at {svc.see}: policies {', '.join(policies)}")
    return 0


def register_train_commands(commands: Any) -> None:
    """Add `train` and `create-run` to the command registry."""
    p = commands.add(("train",), "Train one policy of a run (GRPO + its sharing probe).", _train)
    p.add_argument("-c", "--config", required=True, help="Run YAML with a `trainer:` section.")
    p.add_argument("--policy", default=None,
                   help="Which of the config's policies this process trains.")
    p.add_argument("--resume", action="store_true",
                   help="Continue from the latest checkpoint of this policy, if any.")
    p.add_argument("--rounds", type=int, default=None, help="Override grpo.rounds.")
    p.add_argument("--dry-run", action="store_true",
                   help="Print each policy's memory plan (from model configs only) and exit; "
                        "exit 2 when a policy does not fit its device.")
    p.add_argument("--device-memory-gb", type=float, default=None,
                   help="Device size for --dry-run in GiB (default: the CUDA device's, or "
                        "host RAM for CPU policies).")
    p.add_argument("--prompt-tokens", type=int, default=None,
                   help="Prompt length per rollout for --dry-run (default: each policy's "
                        "longest rendered prompt of the task and benchmarks).")
    p.add_argument("--nproc", type=int, default=None,
                   help="Data-parallel ranks for this policy (overrides the policy's nproc): "
                        "started by torchrun's elastic launcher, FSDP2 over gloo (CPU) or NCCL.")
    r = commands.add(("create-run",), "Create a run config's run in SEE with the run's secret "
                     "(trainers holding a policy token may not create it).", _create_run)
    r.add_argument("-c", "--config", required=True, help="Run YAML with a `trainer:` section.")
