"""`mutualrl thl serve` and `mutualrl bench thl`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mutualrl.common.commands import Commands


def _serve(args: argparse.Namespace) -> int:
    from mutualrl.common import event_loop
    from mutualrl.common.config import load_section
    from mutualrl.thl.config import ThlConfig
    from mutualrl.thl.server import serve

    cfg = load_section(args.config, "thl", ThlConfig, host=args.host, port=args.port,
                       metrics_port=args.metrics_port, redis_url=args.redis_url)
    event_loop.run(serve(cfg), cfg.event_loop)
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


def register(commands: Commands) -> None:
    p = commands.add(["thl", "serve"], "Run the THL gRPC service (section `thl:` of the config).",
                     _serve)
    p.add_argument("--config", default=None, help="Run YAML; its `thl:` section is read.")
    p.add_argument("--host", default=None, help="Override thl.host.")
    p.add_argument("--port", type=int, default=None, help="Override thl.port (default 50052).")
    p.add_argument("--metrics-port", type=int, default=None,
                   help="Override thl.metrics_port (default 9102).")
    p.add_argument("--redis-url", default=None, help="Override thl.redis_url.")

    commands.group(["bench"], "Benchmarks (each figure a ratio against an anchor).")
    p = commands.add(["bench", "thl"], "THL alignment throughput vs spacy-alignments.", _bench)
    p.add_argument("--json", default=None, help="Write the result JSON here.")
    p.add_argument("--texts", type=int, default=2000, help="Texts in the corpus (>= 2000).")
    p.add_argument("--seed", type=int, default=0, help="Corpus and value seed.")
    p.add_argument("--batch", type=int, default=64, help="Items per align_batch call.")
    p.add_argument("--repeats", type=int, default=3, help="Timed passes; the best is reported.")
    p.add_argument("--source", default="byte_bpe", help="Source tokenizer kind.")
    p.add_argument("--target", default="wordpiece", help="Target tokenizer kind.")
