"""Start and run the MWRA gRPC server (shared builder: auth, health, reflection, metrics, TLS)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc

from mutualrl.common.grpc_server import ServiceServer, serve_until_signalled, start_server
from mutualrl.mwra.access import ACCESS
from mutualrl.mwra.config import MwraConfig
from mutualrl.mwra.coordinator import Coordinator
from mutualrl.mwra.servicer import SERVICE_NAME, AllocatorService
from mutualrl.mwra.store import MwraStore
from mutualrl.v1 import allocation_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


@dataclass
class MwraServer(ServiceServer):
    """A started MWRA: the gRPC server, the servicer, the coordinator (the leader loop) and
    their store.

    Stopping releases the leader locks (a successor need not wait for their TTL) and closes
    the store, after the calls in flight have drained."""

    service: AllocatorService
    coordinator: Coordinator
    store: MwraStore


async def start_mwra(cfg: MwraConfig) -> MwraServer:
    store = MwraStore.from_url(cfg.redis_url, cfg.redis_timeout_seconds, cfg.key_prefix,
                               cfg.redis_max_connections)
    await store.r.ping()  # fail at start, not at the first call, when Redis is unreachable
    coordinator = Coordinator(cfg, store)
    service = AllocatorService(coordinator)

    def add(server: grpc.aio.Server) -> None:
        pb_grpc.add_AllocatorServicer_to_server(service, server)

    running = await start_server(cfg, add, [SERVICE_NAME], access=ACCESS)
    running.on_close.extend([coordinator.close, store.close])
    coordinator.start()
    log.info("MWRA replica %s: strategy %s, worker lease %.1fs, policy lease %.1fs, redis %s",
             coordinator.replica, cfg.strategy, cfg.worker_lease_seconds, cfg.policy_lease_seconds,
             cfg.redis_url.split("@")[-1])
    return MwraServer(grpc=running, service=service, coordinator=coordinator, store=store)


async def serve(cfg: MwraConfig) -> None:
    """`mutualrl mwra serve`: run until SIGINT/SIGTERM, then stop gracefully."""
    srv = await start_mwra(cfg)
    await serve_until_signalled(srv.grpc, cfg.grace_seconds,
                                ready=f"MWRA listening on {cfg.host}:{srv.port}")
