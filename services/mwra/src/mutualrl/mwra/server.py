"""Start and run the MWRA gRPC server (shared builder: auth, health, reflection, metrics, TLS)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import grpc

from mutualrl.common.grpc_server import RunningServer, serve_until_signalled, start_server
from mutualrl.mwra.config import MwraConfig
from mutualrl.mwra.service import SERVICE_NAME, AllocatorService
from mutualrl.mwra.store import MwraStore
from mutualrl.v1 import allocation_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


@dataclass
class MwraServer:
    """A started MWRA: the gRPC server, the servicer (leader loop inside) and its store."""

    running: RunningServer
    service: AllocatorService
    store: MwraStore

    @property
    def address(self) -> str:
        return self.running.address

    @property
    def port(self) -> int:
        return self.running.port

    async def stop(self, grace: float | None = None) -> None:
        """Stop serving, release the leader locks (a successor need not wait for the TTL)."""
        await self.running.stop(grace)
        await self.service.close()
        await self.store.close()


async def start_mwra(cfg: MwraConfig) -> MwraServer:
    store = MwraStore.from_url(cfg.redis_url, cfg.redis_timeout_seconds)
    await store.r.ping()  # fail at start, not at the first call, when Redis is unreachable
    service = AllocatorService(cfg, store)

    def add(server: grpc.aio.Server) -> None:
        pb_grpc.add_AllocatorServicer_to_server(service, server)

    running = await start_server(cfg, add, [SERVICE_NAME])
    service.start()
    log.info("MWRA replica %s: strategy %s, worker lease %.1fs, policy lease %.1fs, redis %s",
             service.replica, cfg.strategy, cfg.worker_lease_seconds, cfg.policy_lease_seconds,
             cfg.redis_url.split("@")[-1])
    return MwraServer(running=running, service=service, store=store)


async def serve(cfg: MwraConfig) -> None:
    """Run until SIGINT/SIGTERM."""
    srv = await start_mwra(cfg)
    print(f"MWRA listening on {cfg.host}:{srv.port}", flush=True)

    async def cleanup() -> None:
        await srv.service.close()
        await srv.store.close()

    await serve_until_signalled(srv.running, cfg.grace_seconds, on_stop=cleanup)
