"""Run THL: build the registry (Redis / state dir / memory), the engine and the gRPC server."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc

from mutualrl.common.grpc_server import ServiceServer, serve_until_signalled, start_server
from mutualrl.thl.access import ACCESS, large_requests
from mutualrl.thl.config import ThlConfig
from mutualrl.thl.engine import AlignmentEngine, EngineLimits
from mutualrl.thl.registry import (
    JsonFileStore,
    MemoryStore,
    RedisStore,
    RegistryLimits,
    RegistryStore,
    TokenizerRegistry,
)
from mutualrl.thl.servicer import SERVICE_NAME, AlignmentServicer, add_to_server

log = logging.getLogger(__name__)


def build_store(cfg: ThlConfig) -> RegistryStore:
    if cfg.redis_url:
        return RedisStore(cfg.redis_url, cfg.key_prefix)
    if cfg.state_dir is not None:
        return JsonFileStore(cfg.state_dir)
    log.warning("THL has neither redis_url nor state_dir: registrations live in memory only")
    return MemoryStore()


def build_engine(cfg: ThlConfig) -> AlignmentEngine:
    """The engine a THL process serves (also what an in-process trainer can build from config)."""
    registry = TokenizerRegistry(build_store(cfg), cfg.cache_size, cfg.tokenizer_roots,
                                 limits=RegistryLimits(
                                     cache_max_bytes=cfg.cache_max_bytes,
                                     max_tokenizer_bytes=cfg.max_tokenizer_bytes,
                                     max_tokenizers=cfg.max_tokenizers,
                                     max_runs_per_tokenizer=cfg.max_runs_per_tokenizer))
    log.info("THL reads tokenizers registered over gRPC from under: %s",
             ", ".join(str(r) for r in registry.roots or []) or "(nowhere)")
    engine = AlignmentEngine(registry, EngineLimits(max_batch=cfg.max_batch,
                                                    max_text_bytes=cfg.max_text_bytes,
                                                    max_request_text_bytes=(
                                                        cfg.max_request_text_bytes),
                                                    align_block_items=cfg.align_block_items,
                                                    max_response_bytes=cfg.max_message_bytes))
    for tokenizer_id, path in cfg.tokenizers.items():
        # The operator's own config: not confined to the roots clients are held to.
        info = registry.register(tokenizer_id, path, overwrite=True, confined=False)
        log.info("registered tokenizer %s (%s, %d ids) from %s", tokenizer_id, info.model_type,
                 info.vocab_size, path)
    return engine


@dataclass
class ThlServer(ServiceServer):
    """A running THL: the gRPC server and its engine."""

    cfg: ThlConfig
    engine: AlignmentEngine


async def start_thl(cfg: ThlConfig, engine: AlignmentEngine | None = None) -> ThlServer:
    """Start THL on cfg.host:cfg.port (0 = free port) with health, reflection, auth, metrics."""
    engine = engine if engine is not None else build_engine(cfg)
    servicer = AlignmentServicer(engine, cfg.work_threads, cfg.max_working_bytes)

    def add(server: grpc.aio.Server) -> None:
        add_to_server(servicer, server)

    running = await start_server(cfg, add, [SERVICE_NAME], access=ACCESS,
                                 large_requests=large_requests(cfg))

    async def close_registry() -> None:
        servicer.close()
        engine.registry.close()

    running.on_close.append(close_registry)
    return ThlServer(grpc=running, cfg=cfg, engine=engine)


async def serve(cfg: ThlConfig) -> None:
    """`mutualrl thl serve`: run until SIGINT/SIGTERM, then stop gracefully."""
    server = await start_thl(cfg)
    await serve_until_signalled(server.grpc, cfg.grace_seconds,
                                ready=f"THL listening on {cfg.host}:{server.port}")
