"""A private redis-server for `mutualrl up` when no REDIS_URL is given."""

from __future__ import annotations

import shutil
from pathlib import Path

from mutualrl.launch.probes import free_port, redis_ping
from mutualrl.launch.supervisor import ProcessSpec

INSTALL_HINT = (
    "redis-server was not found on PATH. Install it (Debian/Ubuntu: "
    "`sudo apt-get install redis-server`; macOS: `brew install redis`; conda: "
    "`conda install -c conda-forge redis`) or point MutualRL at an existing Redis with "
    "REDIS_URL=redis://host:6379/0."
)


class RedisMissing(RuntimeError):
    pass


def local_redis_spec(run_dir: Path) -> tuple[ProcessSpec, str]:
    """A redis-server on a free port with AOF persistence in `run_dir/redis`, and its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisMissing(INSTALL_HINT)
    port = free_port()
    data = run_dir / "redis"
    data.mkdir(parents=True, exist_ok=True)
    url = f"redis://127.0.0.1:{port}/0"
    argv = [binary, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data),
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            "--protected-mode", "yes"]
    spec = ProcessSpec(name="redis", argv=argv, log_path=run_dir / "logs" / "redis.log",
                       health=redis_ping(url), stop_group=0)
    return spec, url
