"""`mutualrl thl register|list`: talk to a running THL."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from mutualrl.common.commands import Commands

if TYPE_CHECKING:
    from mutualrl.client.thl import ThlClient


def _client(args: argparse.Namespace) -> ThlClient:
    from mutualrl.client.thl import ThlClient
    from mutualrl.common.channel import INTERACTIVE_OUTAGE_BUDGET

    # A person waits for the answer: a THL that is not there is said within seconds.
    return ThlClient(args.addr, token=args.token, outage_budget=INTERACTIVE_OUTAGE_BUDGET)


def _register(args: argparse.Namespace) -> int:
    import grpc

    with _client(args) as thl:
        try:
            info = thl.register(args.id, str(Path(args.path).resolve()), args.overwrite,
                                run_id=args.run_id)
        except grpc.RpcError as err:
            print(f"{err.code().name}: {err.details()}", file=sys.stderr)
            return 1
    print(json.dumps(info.__dict__))
    return 0


def _list(args: argparse.Namespace) -> int:
    import grpc

    with _client(args) as thl:
        try:
            infos = thl.list()
        except grpc.RpcError as err:
            print(f"{err.code().name}: {err.details()}", file=sys.stderr)
            return 1
    for info in infos:
        print(json.dumps(info.__dict__))
    return 0


def _client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--addr", default="127.0.0.1:50052", help="host:port of THL.")
    p.add_argument("--token", default=None, help="Bearer token (default MUTUALRL_AUTH_TOKEN).")


def register(commands: Commands) -> None:
    p = commands.add(["thl", "register"], "Register a tokenizer path with a running THL.",
                     _register)
    _client_args(p)
    p.add_argument("--id", required=True,
                   help="Tokenizer id (1-128 of [A-Za-z0-9._/-], first a letter or digit).")
    p.add_argument("--path", required=True, help="Tokenizer directory or tokenizer.json.")
    p.add_argument("--overwrite", action="store_true", help="Replace an existing id.")
    p.add_argument("--run-id", default="",
                   help="Register for this run (THL's DeleteRun of the run releases it); "
                        "default: kept until overwritten.")

    p = commands.add(["thl", "list"], "List the tokenizers a running THL knows.", _list)
    _client_args(p)

