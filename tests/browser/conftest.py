"""A real short run for the dashboard's browser tests: `mutualrl up` (SEE, THL, MWRA and three
trainers of different families and tokenizer kinds, with a bearer token) and headless Chromium
driven by Playwright's Python API.

Chromium is Debian's package (`scripts/ensure_chromium.sh` installs it; `make setup` and
`.ci/run` call it), pointed at with `executable_path`: Playwright's own browser download is never
used. Screenshots of every view go to build/screenshots/ (MUTUALRL_SCREENSHOTS overrides).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("MUTUALRL_SCREENSHOTS") or ROOT / "build" / "screenshots")
TOKEN_KEY = "mutualrl.see.token"  # api.js keeps the token under this sessionStorage key
POLICIES = ["gpt2-bpe", "llama-char", "qwen2-unigram"]


def chromium_path() -> str:
    path = os.environ.get("MUTUALRL_CHROMIUM") or shutil.which("chromium") or \
        shutil.which("chromium-browser")
    if path is None:
        pytest.fail("Debian's chromium is missing: run scripts/ensure_chromium.sh "
                    "(make setup does)")
    return path


@dataclass
class LiveRun:
    run_id: str
    token: str
    dashboard: str
    """The URL `mutualrl up` printed."""
    rest: str
    see_grpc: str
    state: dict[str, Any]
    log_path: Path
    proc: subprocess.Popen[bytes]

    def url(self, path: str) -> str:
        return self.rest + path

    def get(self, path: str, **params: Any) -> Any:
        """A REST call with the token (what the page sees)."""
        import httpx

        r = httpx.get(self.rest + path, params=params,
                      headers={"Authorization": f"Bearer {self.token}"}, timeout=30)
        r.raise_for_status()
        return r.json()


def _config(tmp: Path, run_id: str) -> Path:
    cfg = {
        # Three worker slots: each policy trains every round (no time-sharing waits).
        "up": {"restart": "never", "health_timeout": 180, "stop_grace": 60,
               "status_every": 0.5, "serve_after": True, "worker_slots": 3},
        "trainer": {
            "run_id": run_id,
            "output_dir": str(tmp / "runs"),
            "task": {"regime": "short", "skills": ["add", "rev", "sort"],
                     "heldout_per_skill": 4},
            "grpo": {"group_size": 4, "prompts_per_round": 4, "rounds": 100_000,
                     "max_new_tokens": 8},
            # PRP at chunk level: peer rollouts cross THL every round (transfers of every kind
            # but successes, importance weights, residual).
            "probe": {"kind": "prp", "prp_level": "chunk", "prp_weight_mode": "truncate",
                      "deadline_seconds": 2.0},
            "eval": {"every": 3, "per_skill": 4},
            "checkpoint": {"every": 100_000},
            "metrics": {"tensorboard": False},
            "policies": [{"name": p, "preset": p} for p in POLICIES],
        },
    }
    path = tmp / "dashboard-run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@pytest.fixture(scope="module")
def live_run(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[LiveRun]:
    tmp = tmp_path_factory.mktemp("dashboard")
    run_id = f"dash{uuid.uuid4().hex[:8]}"
    token = f"tok-{uuid.uuid4().hex}"
    env = {**os.environ, "MUTUALRL_AUTH_TOKEN": token, "REDIS_URL": redis_url}
    log_path = tmp / "up.log"
    log = log_path.open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "mutualrl.cli", "up", "-c",
                             str(_config(tmp, run_id))], stdout=log, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)
    state_path = tmp / "runs" / run_id / "up.json"
    try:
        deadline = time.monotonic() + 240
        state: dict[str, Any] = {}
        while time.monotonic() < deadline:
            assert proc.poll() is None, log_path.read_text(errors="replace")[-4000:]
            if state_path.exists():
                state = json.loads(state_path.read_text())
                if all(f"trainer-{p}" in state["pids"] for p in POLICIES) and \
                        _healthy(state["endpoints"]["see_rest"] + "/healthz"):
                    break
            time.sleep(0.5)
        else:
            pytest.fail("mutualrl up did not start the trainers in 240 s:\n"
                        + log_path.read_text(errors="replace")[-4000:])
        run = LiveRun(run_id=run_id, token=token, dashboard=state["endpoints"]["dashboard"],
                      rest=state["endpoints"]["see_rest"], see_grpc=state["endpoints"]["see_grpc"],
                      state=state, log_path=log_path, proc=proc)
        _wait_training(run, deadline + 120)
        yield run
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
        _drop_keys(redis_url, run_id)


def _wait_training(run: LiveRun, deadline: float) -> None:
    """Until every trainer has created the run and reported its first round to SEE."""
    import httpx

    while time.monotonic() < deadline:
        assert run.proc.poll() is None, run.log_path.read_text(errors="replace")[-4000:]
        try:
            rows = run.get(f"/v1/runs/{run.run_id}/metrics", limit=10_000)["rows"]
        except httpx.HTTPStatusError as err:
            if err.response.status_code != 404:  # 404: no trainer has created the run yet
                raise
            rows = []
        if {r["policy_id"] for r in rows} == set(POLICIES):
            return
        time.sleep(0.5)
    pytest.fail("the trainers reported no round in time:\n"
                + run.log_path.read_text(errors="replace")[-4000:])


def _drop_keys(redis_url: str, run_id: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"*{run_id}*", count=1000))
        if keys:
            client.delete(*keys)
        client.srem("mrl:see:runs", run_id)
        # THL keeps every registration in one hash: drop this run's tokenizers (<run>/<policy>).
        for reg in client.scan_iter(match="*:thl:tokenizers", count=1000):
            mine = [f for f in client.hkeys(reg) if f.decode().startswith(f"{run_id}/")]
            if mine:
                client.hdel(reg, *mine)
    finally:
        client.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        # --no-sandbox: CI runs as root, where Chromium's sandbox cannot start.
        b = pw.chromium.launch(executable_path=chromium_path(), headless=True,
                               args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            yield b
        finally:
            b.close()


class Page:
    """A page of the dashboard with every console error and page error it produced."""

    def __init__(self, browser: Any, run: LiveRun, *, with_token: bool = True) -> None:
        self.context = browser.new_context(viewport={"width": 1440, "height": 1000})
        self.context.set_default_timeout(90_000)
        if with_token:  # as if the token was entered once earlier in this tab
            self.context.add_init_script(
                f"sessionStorage.setItem({json.dumps(TOKEN_KEY)}, {json.dumps(run.token)});")
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[tuple[float, str]] = []
        self.page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text}")
                     if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.page.on("request", lambda r: self.requests.append((time.monotonic(), r.url)))

    def shot(self, name: str) -> Path:
        SHOTS.mkdir(parents=True, exist_ok=True)
        path = SHOTS / f"dashboard-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def open_page(browser: Any, live_run: LiveRun) -> Iterator[Any]:
    """open_page(with_token=True) -> Page; every page it opened is closed afterwards."""
    pages: list[Page] = []

    def make(with_token: bool = True) -> Page:
        pages.append(Page(browser, live_run, with_token=with_token))
        return pages[-1]

    yield make
    for p in pages:
        p.close()
