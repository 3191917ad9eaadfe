"""The HTTP API and page: ``create_app()`` builds the FastAPI application."""

from __future__ import annotations

import hmac
import time
from importlib import resources
from typing import Annotated, Any

from fastapi import FastAPI, Path, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel

from elastrain.dashboard_api._private.metrics import ApiMetrics
from elastrain.dashboard_api._private.source import BadRequest, RaySource, Unavailable
from elastrain.dashboard_api._version import __version__
from elastrain.state import MAX_PAGE, RunStatus, TrainRunInfo

DEFAULT_PAGE = 50


class RunsPage(BaseModel):
    """A page of runs, newest first; pass ``next_cursor`` as ``cursor`` for the next page (null: no more)."""

    runs: list[TrainRunInfo]
    next_cursor: str | None


class Problem(BaseModel):
    """An error: what went wrong and, where a parameter is at fault, which one."""

    detail: str
    field: str | None = None


class Health(BaseModel):
    status: str
    ray: bool
    tracking: bool
    version: str


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": Problem, "description": "A parameter holds something this API did not make"},
    401: {"model": Problem, "description": "The bearer token is missing or wrong"},
    503: {"model": Problem, "description": "Run tracking is off, or Ray or the state actor is unreachable"},
}


def create_app(source: Any = None, *, token: str | None = None) -> FastAPI:
    """The application. ``token``: every API and metrics request must carry ``Authorization: Bearer <token>``
    (the page itself holds no data and loads without it). ``source``: where runs come from (default: the
    state actor of the Ray cluster this process is connected to)."""
    runs_source = source if source is not None else RaySource()
    metrics = ApiMetrics()
    app = FastAPI(
        title="elastrain dashboard API",
        version=__version__,
        description="Training runs recorded by elastrain-state: paged, filtered, with live worker status.",
    )

    @app.middleware("http")
    async def guard_and_measure(request: Request, call_next: Any) -> Response:
        started = time.perf_counter()
        path = request.url.path
        guarded = path.startswith("/api/") or path == "/metrics"
        if token is not None and guarded and not _token_matches(request.headers.get("authorization", ""), token):
            return JSONResponse(
                {"detail": "Missing or wrong bearer token: send 'Authorization: Bearer <token>'."},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        response: Response = await call_next(request)
        route = request.scope.get("route")
        metrics.observe(getattr(route, "path", "unmatched"), response.status_code, time.perf_counter() - started)
        return response

    @app.exception_handler(Unavailable)
    async def unavailable(request: Request, error: Unavailable) -> JSONResponse:
        return JSONResponse({"detail": str(error)}, status_code=503)

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, error: BadRequest) -> JSONResponse:
        return JSONResponse({"detail": str(error), "field": error.field}, status_code=400)

    @app.get("/api/train/runs", response_model=RunsPage, responses=_ERRORS, summary="List runs, newest first")
    def list_runs(
        status: Annotated[RunStatus | None, Query(description="Only runs with this status")] = None,
        job_id: Annotated[str | None, Query(max_length=256, description="Only runs of this Ray job")] = None,
        name: Annotated[str | None, Query(max_length=1024, description="Only runs with this name")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="Runs per page")] = DEFAULT_PAGE,
        cursor: Annotated[str | None, Query(max_length=2048, description="next_cursor of the previous page")] = None,
    ) -> RunsPage:
        runs, next_cursor = runs_source.list_runs(status=status, job_id=job_id, name=name, limit=limit, cursor=cursor)
        return RunsPage(runs=runs, next_cursor=next_cursor)

    @app.get(
        "/api/train/runs/{run_id}",
        response_model=TrainRunInfo,
        responses={**_ERRORS, 404: {"model": Problem, "description": "No such run"}},
        summary="One run with its workers",
    )
    def get_run(run_id: Annotated[str, Path(max_length=256)]) -> Any:
        run = runs_source.get_run(run_id)
        if run is None:
            return JSONResponse({"detail": f"No run with id {run_id!r}.", "field": "run_id"}, status_code=404)
        return run

    @app.get("/healthz", response_model=Health, summary="Liveness, and whether Ray and tracking are reachable")
    def health() -> Health:
        try:
            runs_source.info()
            ray_up, tracking = True, True
        except Unavailable as error:
            ray_up, tracking = "Ray" not in str(error), False
        return Health(status="ok", ray=ray_up, tracking=tracking, version=__version__)

    @app.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics")
    def prometheus() -> PlainTextResponse:
        try:
            by_status = runs_source.info().get("by_status", {})
        except Unavailable:
            by_status = None
        return PlainTextResponse(metrics.render(by_status), media_type="text/plain; version=0.0.4")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page() -> HTMLResponse:
        html = resources.files("elastrain.dashboard_api").joinpath("static", "index.html").read_text()
        return HTMLResponse(html, headers={"Content-Security-Policy": _PAGE_POLICY})

    return app


# The page loads nothing from elsewhere and talks only to this server.
_PAGE_POLICY = "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'"


def _token_matches(header: str, token: str) -> bool:
    scheme, _, value = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())
