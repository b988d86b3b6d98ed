"""Bearer-token authentication and scoped credentials shared by every gRPC service and REST app.

One secret per run (`auth_token` / MUTUALRL_AUTH_TOKEN) is the admin credential: it opens
everything, as a single shared token always did. Narrower tokens are derived from it, so a
service needs no list of tokens, only the secret:

- the secret itself: everything (admin);
- `read.<hex>`, hex = HMAC-SHA256(secret, "read"): the read RPCs and SEE's REST API (people,
  dashboards);
- `policy.<name>.<hex>`, hex = HMAC-SHA256(secret, "policy:<name>"): act as policy `<name>`
  only (publish its records, fetch and ack its deliveries, report its costs), plus the reads.

`derive_token(secret, "read")` / `derive_token(secret, "policy:a")` make them. Each service
declares per method what it needs (`Access`); a method it does not list is admin only. A valid
token that may not call a method gets PERMISSION_DENIED (HTTP 403); a missing or unknown token
UNAUTHENTICATED (HTTP 401).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from mutualrl.common.errors import quote, quote_all
from mutualrl.common.handlers import HandlerInterceptor, guarded
from mutualrl.common.request_parsing import UnparsableRequest

# Kubernetes gRPC probes and load balancers cannot send metadata, so health stays open.
DEFAULT_EXEMPT = ("/grpc.health.v1.Health/",)
UNAUTHENTICATED_MESSAGE = "missing or invalid bearer token in 'authorization' metadata"
READ_SCOPE = "read"
POLICY_SCOPE = "policy:"


def derive_token(secret: str, scope: str) -> str:
    """The token of `scope` ("read" or "policy:<name>") under the run's `secret`."""
    mac = hmac.new(secret.encode(), scope.encode(), hashlib.sha256).hexdigest()
    if scope == READ_SCOPE:
        return f"read.{mac}"
    if scope.startswith(POLICY_SCOPE) and scope[len(POLICY_SCOPE):]:
        return f"policy.{scope[len(POLICY_SCOPE):]}.{mac}"
    raise ValueError(f"scope must be 'read' or 'policy:<name>', not {scope!r}")


class Role(enum.Enum):
    ADMIN = "admin"
    READ = "read"
    POLICY = "policy"


@dataclass(frozen=True)
class Principal:
    """Who a valid token speaks for."""

    role: Role
    policy: str = ""
    """The policy a POLICY token acts as."""


def _presented(header_value: str | None) -> str | None:
    if not header_value:
        return None
    scheme, _, presented = header_value.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return presented.strip()


def identify(header_value: str | None, secret: str) -> Principal | None:
    """The principal of an 'authorization: Bearer <token>' value, None when the token is not
    the secret nor derived from it (constant-time comparisons)."""
    presented = _presented(header_value)
    if presented is None:
        return None
    if hmac.compare_digest(presented.encode(), secret.encode()):
        return Principal(Role.ADMIN)
    if presented.startswith("read."):
        expected = derive_token(secret, READ_SCOPE)
        return Principal(Role.READ) if hmac.compare_digest(presented.encode(),
                                                           expected.encode()) else None
    if presented.startswith("policy."):
        name, _, _ = presented[len("policy."):].rpartition(".")
        if not name:
            return None
        expected = derive_token(secret, POLICY_SCOPE + name)
        if hmac.compare_digest(presented.encode(), expected.encode()):
            return Principal(Role.POLICY, name)
    return None


def claimed_policy(token: str | None) -> str | None:
    """The policy a token says it acts for (`policy.<name>.<mac>`), None for any other token.
    Not verified (the server does): a client reads it to leave out what its scope may not
    call."""
    if not token or not token.startswith("policy."):
        return None
    name, _, _ = token[len("policy."):].rpartition(".")
    return name or None


def token_matches(header_value: str | None, token: str) -> bool:
    """True when `header_value` is exactly 'Bearer <token>' (constant-time comparison)."""
    presented = _presented(header_value)
    return presented is not None and hmac.compare_digest(presented.encode(), token.encode())


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata that authenticates a client call (empty when no token)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


ActsAs = Callable[[Any], Iterable[str]]
"""The policies a request acts as (from the parsed request; SEE's Publish gets raw bytes)."""


@dataclass(frozen=True)
class Access:
    """What a method needs. `read`: any valid token. `acts_as` set: the admin, or a policy
    token whose policy is every one the request acts as. Neither: the admin only."""

    read: bool = False
    acts_as: ActsAs | None = None


READ = Access(read=True)


def as_policy(field: str = "policy_id") -> Access:
    """A method a policy may call for itself: the request's `field` names the policy."""
    return Access(acts_as=lambda request: (getattr(request, field),))


def as_policies(repeated: str, field: str = "policy_id") -> Access:
    """A method a policy may call for itself: every entry of `repeated` names the policy."""
    return Access(acts_as=lambda request: [getattr(e, field) for e in getattr(request,
                                                                                repeated)])


Rules = Mapping[str, Access]
"""Full method path ("/mutualrl.v1.ExperienceExchange/Publish") -> what it needs."""

DEFAULT_RULES: Rules = {
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": READ,
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": READ,
}


def _deny(code: grpc.StatusCode, message: str) -> Callable[[Any, grpc.aio.ServicerContext],
                                                            Awaitable[None]]:
    async def check(request: Any, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    return check


def _acts_as_check(principal: Principal, method: str, acts_as: ActsAs
                   ) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[None]]:
    async def check(request: Any, context: grpc.aio.ServicerContext) -> None:
        if isinstance(request, UnparsableRequest):
            return  # answered INVALID_ARGUMENT by the parsing layer
        try:
            names = set(acts_as(request))
        except Exception:  # raw bytes that do not parse: the handler answers those
            return
        if names != {principal.policy}:
            others = sorted(n for n in names if n != principal.policy)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"the token of policy {quote(principal.policy)} may not call "
                                f"{method} as {quote_all(others) if others else 'no policy'}")

    return check


class BearerAuthInterceptor(HandlerInterceptor):
    """Rejects every call without a valid bearer token (health checks excepted) and every call
    its token's scope does not allow (`rules`; the secret itself, the admin, may do all)."""

    def __init__(self, token: str, exempt_prefixes: tuple[str, ...] = DEFAULT_EXEMPT,
                 rules: Rules | None = None) -> None:
        self._token = token
        self._exempt = exempt_prefixes
        self._rules = {**DEFAULT_RULES, **(rules or {})}

    def wrap(self, handler: grpc.RpcMethodHandler,
             details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = details.method or ""
        if method.startswith(self._exempt):
            return handler
        metadata = dict(details.invocation_metadata or ())
        principal = identify(metadata.get("authorization"), self._token)
        if principal is None:
            return guarded(handler, _deny(grpc.StatusCode.UNAUTHENTICATED,
                                          UNAUTHENTICATED_MESSAGE))
        if principal.role == Role.ADMIN:
            return handler
        access = self._rules.get(method, Access())
        if access.read:
            return handler
        if principal.role == Role.POLICY and access.acts_as is not None:
            return guarded(handler, _acts_as_check(principal, method, access.acts_as))
        scope = ("read-only" if principal.role == Role.READ
                 else f"policy {quote(principal.policy)}")
        return guarded(handler, _deny(grpc.StatusCode.PERMISSION_DENIED,
                                      f"a {scope} token may not call {method}"))


def rest_access(header_value: str | None, secret: str | None) -> int | None:
    """The HTTP status refusing a REST request (401, 403), None when it may proceed: the
    admin and the read token may read; a policy token is for its trainer's gRPC calls."""
    if secret is None:
        return None
    principal = identify(header_value, secret)
    if principal is None:
        return 401
    return 403 if principal.role == Role.POLICY else None
