"""Exit codes of `mutualrl up` and `mutualrl experiment` (one set, shared by both)."""

from __future__ import annotations

EXIT_OK = 0
"""Every trainer (every run) finished."""
EXIT_FAILED = 1
"""A process failed."""
EXIT_CONFIG = 2
"""Bad config, or no Redis to start."""
EXIT_INTERRUPTED = 130
"""Stopped by SIGINT/SIGTERM (cleanly: trainers checkpoint first)."""
