"""`mutualrl thl serve|register|list` and `mutualrl bench thl`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mutualrl.cli import Commands


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    from mutualrl.common.config import load_section
    from mutualrl.thl.config import ThlConfig
    from mutualrl.thl.server import serve

    cfg = load_section(args.config, "thl", ThlConfig, host=args.host, port=args.port,
                       metrics_port=args.metrics_port, redis_url=args.redis_url)
    asyncio.run(serve(cfg))
    return 0


def _client(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from mutualrl.client.thl import ClientOptions, ThlClient

    return ThlClient(ClientOptions(address=args.addr, token=args.token))


def _register(args: argparse.Namespace) -> int:
    import grpc

    with _client(args) as thl:
        try:
            info = thl.register(args.id, str(Path(args.path).resolve()), args.overwrite)
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


def _bench(args: argparse.Namespace) -> int:
    from mutualrl.thl.bench import run_bench

    result = run_bench(n_texts=args.texts, seed=args.seed, batch=args.batch,
                       repeats=args.repeats, source_kind=args.source, target_kind=args.target)
    text = json.dumps(result, indent=2)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


def _client_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--addr", default="127.0.0.1:50052", help="host:port of THL.")
    p.add_argument("--token", default=None, help="Bearer token (default MUTUALRL_AUTH_TOKEN).")


def register(commands: Commands) -> None:
    p = commands.add(["thl", "serve"], "Run the THL gRPC service (section `thl:` of the config).",
                     _serve)
    p.add_argument("--config", default=None, help="Run YAML; its `thl:` section is read.")
    p.add_argument("--host", default=None, help="Override thl.host.")
    p.add_argument("--port", type=int, default=None, help="Override thl.port (default 50052).")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="Override thl.metrics_port (default 9102).")
    p.add_argument("--redis-url", default=None, help="Override thl.redis_url.")

    p = commands.add(["thl", "register"], "Register a tokenizer path with a running THL.",
                     _register)
    _client_args(p)
    p.add_argument("--id", required=True, help="Tokenizer id ([A-Za-z0-9._/-]{1,128}).")
    p.add_argument("--path", required=True, help="Tokenizer directory or tokenizer.json.")
    p.add_argument("--overwrite", action="store_true", help="Replace an existing id.")

    p = commands.add(["thl", "list"], "List the tokenizers a running THL knows.", _list)
    _client_args(p)

    commands.group(["bench"], "Benchmarks (each figure a ratio against an anchor).")
    p = commands.add(["bench", "thl"], "THL alignment throughput vs spacy-alignments.", _bench)
    p.add_argument("--json", default=None, help="Write the result JSON here.")
    p.add_argument("--texts", type=int, default=2000, help="Texts in the corpus (>= 2000).")
    p.add_argument("--seed", type=int, default=0, help="Corpus and value seed.")
    p.add_argument("--batch", type=int, default=64, help="Items per align_batch call.")
    p.add_argument("--repeats", type=int, default=3, help="Timed passes; the best is reported.")
    p.add_argument("--source", default="byte_bpe", help="Source tokenizer kind.")
    p.add_argument("--target", default="wordpiece", help="Target tokenizer kind.")
