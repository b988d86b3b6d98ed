"""A service process the tests and benchmarks start: its memory from /proc, and its stop."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path


def status(pid: int, field: str) -> int:
    """A byte figure of /proc/<pid>/status ("VmRSS", "VmHWM": the peak since start or since
    `reset_peak`)."""
    text = Path(f"/proc/{pid}/status").read_text(encoding="utf-8")
    found = re.search(rf"^{field}:\s+(\d+) kB", text, re.M)
    if found is None:
        raise RuntimeError(f"no {field} in /proc/{pid}/status")
    return int(found.group(1)) * 1024


def reset_peak(pid: int) -> None:
    """Set the process's VmHWM to its RSS now (Linux: clear_refs 5)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5", encoding="ascii")


def stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM, then SIGKILL after 10 s."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
