"""The page: ``GET /`` and its static files (its script and stylesheet, and uPlot, vendored at build time)."""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import Annotated

from fastapi import FastAPI, Path, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, Response

# Only these files are served (no directory listing, no stray file of the package); name -> content type.
ASSETS = {
    "page.js": "text/javascript; charset=utf-8",
    "page.css": "text/css; charset=utf-8",
    "uplot/uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uplot/uPlot.min.css": "text/css; charset=utf-8",
    "uplot/LICENSE": "text/plain; charset=utf-8",
}
# The page loads nothing from elsewhere, runs no inline script or style, and talks only to this server.
PAGE_POLICY = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'"
_NOT_VENDORED = (
    "uPlot is not in this installation of elastrain-dashboard-api: its build vendors it from the npm registry. "
    "Reinstall the package (pip install -e packages/dashboard-api in a checkout) where registry.npmjs.org is reachable."
)


def add_page_routes(app: FastAPI) -> None:
    """``GET /`` (the page, open: it holds no run data) and ``GET /static/<name>`` for the names in ASSETS.

    Static files are revalidated by ETag on each load (they change with the installed version), never cached
    blindly; run data never passes through here.
    """

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page() -> HTMLResponse:
        html = resources.files("elastrain.dashboard_api").joinpath("static", "index.html").read_text()
        return HTMLResponse(html, headers={"Content-Security-Policy": PAGE_POLICY, "Cache-Control": "no-cache"})

    @app.get("/static/{name:path}", include_in_schema=False)
    def asset(name: Annotated[str, Path(max_length=64)], request: Request) -> Response:
        media_type = ASSETS.get(name)
        if media_type is None:
            return PlainTextResponse("No such file.", status_code=404)
        try:
            content = resources.files("elastrain.dashboard_api").joinpath("static", *name.split("/")).read_bytes()
        except FileNotFoundError:
            return PlainTextResponse(_NOT_VENDORED if name.startswith("uplot/") else "No such file.", status_code=404)
        etag = '"' + hashlib.sha256(content).hexdigest()[:32] + '"'
        headers = {"ETag": etag, "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
        if etag in request.headers.get("if-none-match", ""):
            return Response(status_code=304, headers=headers)
        return Response(content, media_type=media_type, headers=headers)
