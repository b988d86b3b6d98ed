"""The one Redis key scheme of every MutualRL service (pure: no network code).

    <prefix>:<service>:{<run_id>}:<name>   a key of one run (SEE records, MWRA leases, ...)
    <prefix>:<service>:<name>              an index that spans runs (SEE's run registry, THL's
                                           tokenizer registry)

`prefix` is each service's `key_prefix` setting (default "mrl"), so several deployments or test
runs share one Redis without seeing each other's keys; `service` is "see", "thl" or "mwra".
The run id sits in braces, a Redis Cluster hash tag: every key of a run lives in one slot, so a
Lua script or a MULTI may touch all of them, and one `SCAN MATCH <run base>*` finds exactly
them (a run id's alphabet, `ids.RUN_ID`, holds no glob or brace character).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mutualrl.common import ids

PREFIX_PATTERN = r"^[A-Za-z0-9_.-]{1,32}$"
"""What a `key_prefix` may be (no ':' or glob characters: it is matched literally)."""
DEFAULT_PREFIX = "mrl"
SERVICES = ("see", "thl", "mwra")
_PREFIX_RE = re.compile(PREFIX_PATTERN)


@dataclass(frozen=True)
class KeySpace:
    """Key names of one service under one prefix."""

    prefix: str
    service: str

    def __post_init__(self) -> None:
        if not _PREFIX_RE.match(self.prefix):
            raise ValueError(f"key prefix {self.prefix!r} must match {PREFIX_PATTERN}")
        if self.service not in SERVICES:
            raise ValueError(f"service must be one of {SERVICES}, got {self.service!r}")

    def run_base(self, run_id: str) -> str:
        """`<prefix>:<service>:{<run_id>}:`; every key of the run starts with it."""
        ids.check_run_id(run_id)
        return f"{self.prefix}:{self.service}:{{{run_id}}}:"

    def run_key(self, run_id: str, name: str) -> str:
        """One key of one run."""
        return self.run_base(run_id) + name

    def run_pattern(self, run_id: str) -> str:
        """A SCAN MATCH pattern that matches exactly the run's keys."""
        return self.run_base(run_id) + "*"

    def index(self, name: str) -> str:
        """A key that spans runs (`<prefix>:<service>:<name>`)."""
        return f"{self.prefix}:{self.service}:{name}"
