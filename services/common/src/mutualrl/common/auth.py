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
UNAUTHENTICATED (HTTP 401). Both are decided before the request's body is read (`Trust`), so a
refused call costs the service neither the body's bytes nor its parse. A policy token's call
of a method that acts for a policy names that policy in its metadata (`POLICY_HEADER`, which
`bearer_metadata` sets), so a call for another policy is refused unread too; the policies its
body names are then checked against it from the body's tags and lengths.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pool
from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError

from mutualrl.common import wire_scan
from mutualrl.common.errors import (
    InvalidArgument,
    PermissionDenied,
    Unauthenticated,
    quote,
    quote_all,
)

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


POLICY_HEADER = "x-mutualrl-policy"
"""The call metadata naming the policy a call acts for. A policy token's call of a method that
acts for a policy must carry it, naming the token's own policy: the service refuses the call
from its metadata (PERMISSION_DENIED) before reading its body otherwise, and refuses it after
reading when the policies the body names are not this one."""


def bearer_metadata(token: str | None, acts_for: str | None = None
                    ) -> tuple[tuple[str, str], ...]:
    """Call metadata that authenticates a client call (empty when no token): the bearer token
    and, under `POLICY_HEADER`, the policy the call acts for: `acts_for`, by default the policy
    a policy token claims (`claimed_policy`); "" sends no such header."""
    if not token:
        return ()
    policy = claimed_policy(token) if acts_for is None else acts_for
    bearer = ("authorization", f"Bearer {token}")
    return (bearer, (POLICY_HEADER, policy)) if policy else (bearer,)


def acting_for(metadata: Iterable[tuple[str, Any]]) -> str | None:
    """The policy a call's metadata says it acts for (`POLICY_HEADER`), None without one."""
    value = next((v for k, v in metadata if k == POLICY_HEADER), None)
    return value if isinstance(value, str) else None


ActsAs = Callable[[bytes, Descriptor], Iterable[str]]
"""The policies a request acts as, read from its bytes (`mutualrl.common.wire_scan`, never a
parse) given its message type; raises DecodeError when the bytes do not scan."""

SCAN_TAGS = 1 << 20
"""Tags a scan for the policies a request acts as reads at most (a maximal ReportMetrics or
Publish holds about half as many): past it the request is INVALID_ARGUMENT."""


@dataclass(frozen=True)
class Access:
    """What a method needs. `read`: any valid token. `acts_as` set: the admin, or a policy
    token whose policy is every one the request acts as. Neither: the admin only."""

    read: bool = False
    acts_as: ActsAs | None = None


READ = Access(read=True)


def strings_of(*path: str, most: int | None = None) -> ActsAs:
    """The strings at `path` (field names, `("rows", "policy_id")`) of a request's bytes;
    past `most` of them, InvalidArgument naming the path's first field (a request that long
    is refused anyway, and is not scanned to its end)."""

    def read(data: bytes, message: Descriptor) -> list[str]:
        try:
            return wire_scan.strings_at(data, wire_scan.field_path(message, path), SCAN_TAGS,
                                        most)
        except wire_scan.TooMany:
            raise InvalidArgument(path[0], f"more than {most} entries, over the limit of "
                                  f"{most} per call") from None

    return read


def as_policy(field: str = "policy_id") -> Access:
    """A method a policy may call for itself: the request's `field` names the policy."""
    return Access(acts_as=strings_of(field))


def as_policies(repeated: str, field: str = "policy_id", most: int | None = None) -> Access:
    """A method a policy may call for itself: every entry of `repeated` (at most `most`)
    names the policy."""
    return Access(acts_as=strings_of(repeated, field, most=most))


Rules = Mapping[str, Access]
"""Full method path ("/mutualrl.v1.ExperienceExchange/Publish") -> what it needs."""

DEFAULT_RULES: Rules = {
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": READ,
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": READ,
}

BodyCheck = Callable[[bytes], None]
"""Raises PermissionDenied (or InvalidArgument) for a request's bytes its token may not send."""


def _input_type(method: str) -> Descriptor:
    """The request message of a full method path, from the loaded protos."""
    service, _, name = method.strip("/").partition("/")
    found: Descriptor = (descriptor_pool.Default().FindServiceByName(service)
                         .methods_by_name[name].input_type)
    return found


class Trust:
    """Decides from a call's metadata alone, before its body is read, whether it may go on:
    a valid bearer token (health checks exempt) whose scope allows the method (`rules`; the
    secret itself, the admin, may do all). A method a policy may call for itself leaves a
    check of the request's bytes (`BodyCheck`), which reads the policies it names from its
    tags and lengths, never parsing it. `secret` None: auth is off, everything may go on."""

    def __init__(self, secret: str | None, rules: Rules | None = None,
                 exempt_prefixes: tuple[str, ...] = DEFAULT_EXEMPT) -> None:
        self._secret = secret
        self._exempt = exempt_prefixes
        self._rules = {**DEFAULT_RULES, **(rules or {})}

    def decide(self, method: str, metadata: Iterable[tuple[str, Any]]) -> BodyCheck | None:
        """None when the call may go on as it is, a check of its bytes when its policy must
        match what the request names; Unauthenticated / PermissionDenied when it may not."""
        if self._secret is None or method.startswith(self._exempt):
            return None
        metadata = tuple(metadata)
        header = next((v for k, v in metadata if k == "authorization"), None)
        principal = identify(header if isinstance(header, str) else None, self._secret)
        if principal is None:
            raise Unauthenticated("", UNAUTHENTICATED_MESSAGE)
        if principal.role == Role.ADMIN:
            return None
        access = self._rules.get(method, Access())
        if access.read:
            return None
        if principal.role == Role.POLICY and access.acts_as is not None:
            return _acts_as_check(_named(principal.policy, method, metadata), method,
                                  access.acts_as)
        scope = ("read-only" if principal.role == Role.READ
                 else f"policy {quote(principal.policy)}")
        raise PermissionDenied("", f"a {scope} token may not call {method}")


def _named(policy: str, method: str, metadata: Iterable[tuple[str, Any]]) -> str:
    """`policy`, the policy a policy token acts as, when the call's metadata names it
    (`POLICY_HEADER`); PermissionDenied naming the header when it names none or another: a
    token's call is refused by its credentials alone, like any other refusal of them, so the
    body of a call for another policy is never read."""
    named = acting_for(metadata)
    if named is None:
        raise PermissionDenied(POLICY_HEADER, f"a policy token's call of {method} must name "
                               "the policy it acts for in this metadata")
    if named != policy:
        raise PermissionDenied(POLICY_HEADER, f"the token of policy {quote(policy)} may not "
                               f"call {method} for policy {quote(named)}")
    return policy


def _acts_as_check(policy: str, method: str, acts_as: ActsAs) -> BodyCheck:
    def check(data: bytes) -> None:
        try:
            names = set(acts_as(data, _input_type(method)))
        except DecodeError as err:
            raise InvalidArgument("request", f"body is not a valid request of {method}: "
                                  f"{err}") from None
        if names != {policy}:
            others = sorted(n for n in names if n != policy)
            raise PermissionDenied("", f"the token of policy {quote(policy)} may not call "
                                   f"{method} as {quote_all(others) if others else 'no policy'}")

    return check


def rest_access(header_value: str | None, secret: str | None) -> int | None:
    """The HTTP status refusing a REST request (401, 403), None when it may proceed: the
    admin and the read token may read; a policy token is for its trainer's gRPC calls."""
    if secret is None:
        return None
    principal = identify(header_value, secret)
    if principal is None:
        return 401
    return 403 if principal.role == Role.POLICY else None
