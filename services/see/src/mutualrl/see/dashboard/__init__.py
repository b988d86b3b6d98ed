"""SEE's live web dashboard at /ui: the pages (`ui.py`) and the REST routes they read
(`api.py`), mounted on SEE's FastAPI app. Read-only; built from SEE's REST API only."""

from __future__ import annotations

from fastapi import FastAPI

from mutualrl.see.dashboard.api import make_router
from mutualrl.see.dashboard.thl_link import ThlLink
from mutualrl.see.dashboard.ui import PREFIX, is_public, mount_pages
from mutualrl.see.store import SeeStore

__all__ = ["PREFIX", "is_public", "mount"]


def mount(app: FastAPI, store: SeeStore, token: str | None) -> None:
    """Add the dashboard's REST routes and pages to SEE's app; `/v1/session` and the pages
    are open (see `ui.py`), every other route needs the token like the rest of SEE."""
    cfg = store.cfg
    app.include_router(make_router(store, token, ThlLink(cfg.thl_address, token,
                                                         cfg.thl_tls_ca)))
    mount_pages(app)
