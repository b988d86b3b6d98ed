"""Supervised child processes: start in order, wait for health, watch, restart or stop, and shut
down cleanly (trainers first, so they can checkpoint, then services, then Redis)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path


class Restart(StrEnum):
    """What to do when a process exits on its own."""

    NEVER = "never"
    ON_FAILURE = "on-failure"


HealthCheck = Callable[[], bool]


@dataclass
class ProcessSpec:
    """One supervised process."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    health: HealthCheck | None = None
    """Returns True once the process serves; None means 'running is healthy'."""
    restart: Restart = Restart.NEVER
    max_restarts: int = 0
    stop_group: int = 0
    """Processes stop in decreasing group order (trainers 2, services 1, redis 0)."""
    finishes: bool = False
    """True for processes whose clean exit means their work is done (trainers)."""
    gang: str | None = None
    """Processes of one gang fail and restart together (the nodes of one policy: a node
    that dies ends their rendezvous, so the survivors are stopped and all start again)."""


@dataclass
class Child:
    spec: ProcessSpec
    proc: subprocess.Popen[bytes]
    restarts: int = 0
    started_at: float = field(default_factory=time.monotonic)
    reported: bool = False
    """Its exit was handed out by `poll` (once per process)."""

    @property
    def pid(self) -> int:
        return self.proc.pid


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGTERM it when the supervisor dies, so a
    SIGKILLed `mutualrl up` leaves no orphans (its children live in their own sessions)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def tail(path: Path, lines: int = 20) -> str:
    """The last `lines` lines of a log file ('' when it does not exist)."""
    try:
        with path.open("rb") as fh:
            return b"".join(deque(fh, maxlen=lines)).decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


class Supervisor:
    """Starts and watches a set of processes; every child gets its own process group."""

    def __init__(self, log: Callable[[str], None] = print) -> None:
        self.children: dict[str, Child] = {}
        self._log = log

    def start(self, spec: ProcessSpec) -> Child:
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        with spec.log_path.open("ab") as log_fh:
            # A new session per child: a Ctrl-C in the terminal reaches only us, and we stop
            # children in order instead of all at once.
            proc = subprocess.Popen(
                spec.argv, stdout=log_fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **spec.env}, start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        previous = self.children.get(spec.name)
        child = Child(spec=spec, proc=proc, restarts=previous.restarts if previous else 0)
        self.children[spec.name] = child
        return child

    def wait_healthy(self, name: str, timeout: float) -> None:
        """Block until the child's health check passes; raise with its log tail if it dies."""
        child = self.children[name]
        deadline = time.monotonic() + timeout
        while True:
            code = child.proc.poll()
            if code is not None:
                raise ChildFailed(name, code, tail(child.spec.log_path))
            if child.spec.health is None or child.spec.health():
                return
            if time.monotonic() > deadline:
                raise ChildFailed(name, None, tail(child.spec.log_path),
                                  f"not healthy after {timeout:.0f}s")
            time.sleep(0.2)

    def poll(self) -> list[tuple[Child, int]]:
        """Children that exited since the last poll, with their exit codes."""
        exited = []
        for child in self.children.values():
            code = child.proc.poll()
            if code is not None and not child.reported:
                child.reported = True
                exited.append((child, code))
        return exited

    def restart(self, child: Child) -> Child:
        """Start the child's command again; a trainer (`finishes`) continues from its last
        checkpoint (`--resume`), whether one of its processes or one of its ranks died."""
        child.restarts += 1
        if child.spec.finishes and "--resume" not in child.spec.argv:
            child.spec.argv.append("--resume")
        fresh = self.start(child.spec)
        fresh.restarts = child.restarts
        return fresh

    def restart_gang(self, child: Child, grace: float = 20.0) -> list[Child]:
        """Restart `child` with the rest of its gang: the others still running are stopped
        first (SIGTERM, SIGKILL after `grace`; their exits are not reported by `poll`), then
        every member starts again (`restart`), with `child`'s restart count."""
        members = [c for c in self.children.values()
                   if c.spec.gang is not None and c.spec.gang == child.spec.gang]
        self._stop([c for c in members if c is not child], grace)
        out = []
        for member in members:
            member.reported = True
            member.restarts = child.restarts
            out.append(self.restart(member))
        return out

    def _stop(self, members: list[Child], grace: float) -> dict[str, int | None]:
        """SIGTERM `members` (each its process group), SIGKILL whatever outlives `grace`."""
        codes: dict[str, int | None] = {}
        for child in members:
            if child.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in members:
            try:
                child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._log(f"{child.spec.name} did not stop within {grace:.0f}s: killing it")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                child.proc.wait()
            codes[child.spec.name] = child.proc.returncode
        return codes

    def stop_all(self, grace: float = 20.0) -> dict[str, int | None]:
        """SIGTERM each stop group in turn (highest first), SIGKILL whatever outlives `grace`."""
        codes: dict[str, int | None] = {}
        groups = sorted({c.spec.stop_group for c in self.children.values()}, reverse=True)
        for group in groups:
            codes.update(self._stop([c for c in self.children.values()
                                     if c.spec.stop_group == group], grace))
        return codes


class StopSignals:
    """SIGINT/SIGTERM set `received` instead of killing us, so the caller's loop can stop its
    children in order (trainers first) and write what it has."""

    def __init__(self) -> None:
        self.received: int | None = None
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.received = signum


class ChildFailed(RuntimeError):
    """A supervised process exited (or never became healthy)."""

    def __init__(self, name: str, code: int | None, log_tail: str, reason: str = "") -> None:
        why = reason or f"exited with code {code}"
        super().__init__(f"{name} {why}")
        self.name = name
        self.code = code
        self.log_tail = log_tail
