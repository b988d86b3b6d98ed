"""#14 item 11: see.durability=fsync acknowledges a Publish only once the AOF is fsynced; on a
Redis that cannot (AOF off, or appendfsync everysec before 7.2) SEE refuses to start and says
what to change. Each case runs its own redis-server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mutualrl.bench.testing import redis_servers
from mutualrl.bench.testing.see import make_config, rollout
from mutualrl.client.see import AsyncSeeClient, ClientOptions
from mutualrl.see.server import start_see
from mutualrl.see.store.durability import DurabilityError, Mode

pytestmark = pytest.mark.skipif(redis_servers.missing() is not None,
                                reason=redis_servers.missing() or "")


async def test_fsync_with_appendfsync_always_acknowledges_stored_records(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MUTUALRL_AUTH_TOKEN", raising=False)
    with redis_servers.server(["--appendonly", "yes", "--appendfsync", "always"]) as r:
        see = await start_see(make_config(r.url, durability="fsync"))
        try:
            assert see.store.publisher.mode is Mode.ALWAYS
            async with AsyncSeeClient(ClientOptions(address=see.address)) as c:
                await c.create_run("dur-run", ["a", "b"])
                resp = await c.publish("dur-run", [rollout("a", 0, f"p{i}", 0)
                                                   for i in range(3)])
                assert resp.stored == 3
        finally:
            await see.stop(0.2)


@pytest.mark.parametrize(("args", "says"), [
    (["--appendonly", "yes", "--appendfsync", "everysec"], "appendfsync always"),
    (["--appendonly", "no"], "appendonly no"),
])
async def test_fsync_is_refused_where_the_server_cannot_give_it(args: list[str],
                                                                says: str) -> None:
    with redis_servers.server(args) as r:
        version = subprocess.run(["redis-server", "--version"], capture_output=True,
                                 text=True).stdout
        if "v=7.0" not in version and "everysec" in args:
            pytest.skip("this server may use WAITAOF (Redis >= 7.2)")
        with pytest.raises(DurabilityError, match=says) as err:
            await start_see(make_config(r.url, durability="fsync"))
        assert "see.durability" in str(err.value)
        # The default mode asks nothing of the server.
        see = await start_see(make_config(r.url))
        assert see.store.publisher.mode is Mode.REDIS
        await see.stop(0.2)


def test_see_serve_exits_with_the_message(tmp_path: Path) -> None:
    with redis_servers.server(["--appendonly", "no"]) as r:
        cfg = tmp_path / "run.yaml"
        cfg.write_text("see:\n  durability: fsync\n  rest_port: null\n  port: 0\n")
        env = {**os.environ, "MUTUALRL_AUTH_TOKEN": ""}
        done = subprocess.run([sys.executable, "-m", "mutualrl.cli", "see", "serve", "--config",
                               str(cfg), "--redis-url", r.url], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 2, done.stderr[-2000:]
        assert "SEE refuses to start" in done.stderr and "appendonly no" in done.stderr
