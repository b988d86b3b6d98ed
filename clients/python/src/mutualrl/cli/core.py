"""Commands every installation has: `mutualrl version` and `mutualrl health`."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import version

from mutualrl.common.commands import Commands


def _version(args: argparse.Namespace) -> int:
    import platform
    from importlib.metadata import distributions

    import google.protobuf
    import grpc

    names = sorted({d.metadata["Name"] for d in distributions()
                    if (d.metadata["Name"] or "").lower().startswith("mutualrl-")})
    for name in names:
        print(f"{name} {version(name)}")
    print(f"python {platform.python_version()}, grpcio {grpc.__version__}, "
          f"protobuf {google.protobuf.__version__}")
    return 0


def _health(args: argparse.Namespace) -> int:
    """Exit 0 when the service at --addr reports SERVING (for container healthchecks)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from mutualrl.common.auth import bearer_metadata

    with grpc.insecure_channel(args.addr) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=args.service),
                               timeout=args.timeout, metadata=bearer_metadata(args.token))
        except grpc.RpcError as err:
            print(f"{args.addr}: {err.code().name}: {err.details()}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{args.addr}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1


def _token(args: argparse.Namespace) -> int:
    """Print the read or policy token of the secret in MUTUALRL_AUTH_TOKEN."""
    import os

    from mutualrl.common.auth import derive_token
    from mutualrl.common.ids import NAME

    secret = os.environ.get("MUTUALRL_AUTH_TOKEN")
    if not secret:
        print("MUTUALRL_AUTH_TOKEN is not set: it holds the run's secret", file=sys.stderr)
        return 2
    if args.scope == "read":
        print(derive_token(secret, "read"))
        return 0
    if not args.name or not NAME.valid(args.name):
        print(f"policy: a policy name is required ({NAME.described})", file=sys.stderr)
        return 2
    print(derive_token(secret, f"policy:{args.name}"))
    return 0


def register(commands: Commands) -> None:
    commands.add(["version"], "Print the MutualRL version and its key dependencies.", _version)
    p = commands.add(["health"], "Check a service's grpc.health.v1 status (exit 0 = SERVING).",
                     _health)
    p.add_argument("--addr", required=True, help="host:port of the gRPC service.")
    p.add_argument("--service", default="", help="Service name to check ('' = the server).")
    p.add_argument("--timeout", type=float, default=3.0, help="Seconds before giving up.")
    p.add_argument("--token", default=None, help="Bearer token (health is open by default).")
    p = commands.add(["token"], "Print a scoped token derived from the run's secret "
                     "(MUTUALRL_AUTH_TOKEN): 'read', or 'policy NAME'.", _token)
    p.add_argument("scope", choices=["read", "policy"], help="read: reads and SEE's REST API; "
                   "policy: acts as one policy only.")
    p.add_argument("name", nargs="?", help="The policy (scope 'policy').")
