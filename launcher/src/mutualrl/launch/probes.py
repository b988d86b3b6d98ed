"""Health checks `mutualrl up` waits on, and free local ports for the services it starts."""

from __future__ import annotations

import socket
import urllib.request

from mutualrl.launch.supervisor import HealthCheck


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def grpc_serving(address: str, token: str | None = None) -> HealthCheck:
    """grpc.health.v1 Check on the server ('' service) answers SERVING."""

    def check() -> bool:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        from mutualrl.common.auth import bearer_metadata

        with grpc.insecure_channel(address) as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=1.0,
                    metadata=bearer_metadata(token))
            except grpc.RpcError:
                return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    return check


def http_ok(url: str) -> HealthCheck:
    """GET `url` answers 2xx."""

    def check() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1.0) as reply:
                return 200 <= reply.status < 300
        except OSError:
            return False

    return check


def redis_ping(url: str) -> HealthCheck:
    def check() -> bool:
        import redis

        client = redis.Redis.from_url(url, socket_timeout=1.0)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    return check
