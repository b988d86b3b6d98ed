"""Private redis-server processes for tests (loopback ports, temporary directories): a single
server with chosen settings, or a Redis Cluster of masters made with `redis-cli --cluster
create`. Needs redis-server (and redis-cli for a cluster) on PATH; `missing()` says what is not."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path


def missing(cluster: bool = False) -> str | None:
    """Why these servers cannot run here (a skip reason), or None."""
    for tool in ("redis-server", "redis-cli") if cluster else ("redis-server",):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH"
    return None


def free_port(below: int = 65536) -> int:
    """A free loopback port below `below` (a cluster node also listens on port + 10000)."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port < below:
            return port
    raise RuntimeError(f"no free port below {below}")


def _wait_ping(port: int, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"redis-server on port {port} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2) as s:
            s.sendall(b"PING\r\n")
            if s.recv(16).startswith(b"+PONG"):
                return
        time.sleep(0.05)
    raise RuntimeError(f"redis-server on port {port} did not answer in {timeout} s")


@dataclass
class RedisProc:
    """One redis-server process."""

    port: int
    proc: subprocess.Popen[bytes]
    dir: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


def start_server(args: Sequence[str] = (), directory: Path | None = None) -> RedisProc:
    """A redis-server on a free loopback port with extra `args` (e.g. "--appendonly", "yes")."""
    port = free_port(below=55536 if "--cluster-enabled" in args else 65536)
    d = directory or Path(tempfile.mkdtemp(prefix=f"redis-{port}-"))
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d),
         "--save", "", "--protected-mode", "no", *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ping(port, proc)
    except Exception:
        proc.kill()
        raise
    return RedisProc(port, proc, d)


@contextlib.contextmanager
def server(args: Sequence[str] = ()) -> Iterator[RedisProc]:
    p = start_server(args)
    try:
        yield p
    finally:
        p.kill()
        shutil.rmtree(p.dir, ignore_errors=True)


@dataclass
class Cluster:
    """A Redis Cluster of masters on loopback ports (no replicas)."""

    nodes: list[RedisProc] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The `redis+cluster://` URL SEE, THL and MWRA take (any node seeds the client)."""
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", n.port) for n in self.nodes]


@contextlib.contextmanager
def cluster(masters: int = 3, timeout: float = 30.0) -> Iterator[Cluster]:
    """`masters` cluster-enabled redis-servers joined by `redis-cli --cluster create`."""
    c = Cluster()
    try:
        for _ in range(masters):
            d = Path(tempfile.mkdtemp(prefix="redis-cluster-"))
            c.nodes.append(start_server(["--cluster-enabled", "yes", "--cluster-config-file",
                                         str(d / "nodes.conf"), "--appendonly", "no"], d))
        subprocess.run(
            ["redis-cli", "--cluster", "create",
             *[f"127.0.0.1:{n.port}" for n in c.nodes], "--cluster-yes"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # until every node agrees the cluster is up
            states = [subprocess.run(["redis-cli", "-p", str(n.port), "cluster", "info"],
                                     capture_output=True, text=True, timeout=5).stdout
                      for n in c.nodes]
            if all("cluster_state:ok" in s for s in states):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")
        yield c
    finally:
        for n in c.nodes:
            with contextlib.suppress(Exception):
                n.kill()
            shutil.rmtree(n.dir, ignore_errors=True)
