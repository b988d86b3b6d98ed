"""The dashboard's pages: one HTML shell for every /ui path, its ES modules, styles and the
vendored charting library (uPlot, MIT, pinned: static/vendor/README.md), all shipped in the
package; nothing is built at run time.

The pages carry no data, so they are served without the token: a browser cannot attach a
bearer header to a page load. The page asks for the token when `/v1/session` says one is
needed, keeps it in sessionStorage (this tab, until it closes) and sends it with every data
request; a wrong one is refused by `/v1/session` before any data is asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response

STATIC = Path(__file__).parent / "static"
PREFIX = "/ui"
# Scripts only from this origin; uPlot sets element styles, hence 'unsafe-inline' for styles.
HEADERS = {
    "Cache-Control": "no-cache",
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; "
                               "style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                               "connect-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def is_public(path: str) -> bool:
    """The dashboard's pages and static files (no data) are served without the token, and so
    is `/`, which redirects there."""
    return path in ("/", PREFIX) or path.startswith(PREFIX + "/")


class _Static(StaticFiles):
    """Static files revalidated on every load (ETag -> 304), so an upgraded SEE never serves
    a stale script next to a new one."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        resp = super().file_response(*args, **kwargs)
        resp.headers.update({"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"})
        return resp


def mount_pages(app: FastAPI) -> None:
    app.mount(f"{PREFIX}/static", _Static(directory=STATIC), name="dashboard-static")
    shell = (STATIC / "index.html").read_text(encoding="utf-8")

    async def page() -> HTMLResponse:
        return HTMLResponse(shell, headers=HEADERS)

    async def to_ui() -> RedirectResponse:
        return RedirectResponse(PREFIX + "/")

    app.add_api_route("/", to_ui, include_in_schema=False)
    app.add_api_route(PREFIX, page, include_in_schema=False)
    app.add_api_route(PREFIX + "/", page, include_in_schema=False)
    app.add_api_route(PREFIX + "/runs/{rest:path}", page, include_in_schema=False)
