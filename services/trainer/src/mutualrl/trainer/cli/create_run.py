"""`mutualrl create-run -c FILE`: the config's run created in SEE with the run's secret
(MUTUALRL_AUTH_TOKEN), as trainers holding a policy token may not (`mutualrl.see.grpc.access`);
idempotent."""

from __future__ import annotations

import argparse
import sys

import grpc
from pydantic import ValidationError

from mutualrl.client.see import SeeClient
from mutualrl.common.channel import ClientOptions
from mutualrl.trainer.config.run import first_error, load_trainer_config


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load_trainer_config(args.config)
    except ValidationError as err:
        print(f"mutualrl create-run: {first_error(err)}", file=sys.stderr)
        return 2
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
