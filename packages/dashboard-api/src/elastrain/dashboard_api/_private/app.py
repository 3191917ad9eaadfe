"""The HTTP API and page: ``create_app()`` builds the FastAPI application."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, Field

from elastrain.dashboard_api._private.hosts import HostPolicy
from elastrain.dashboard_api._private.metrics import ApiMetrics
from elastrain.dashboard_api._private.page import add_page_routes
from elastrain.dashboard_api._private.source import BadRequest, RaySource, Unavailable
from elastrain.dashboard_api._private.tokens import bearer_dependency, check_token
from elastrain.dashboard_api._version import __version__
from elastrain.state import (
    MAX_HISTORY_PAGE,
    MAX_PAGE,
    MetricHistory,
    RunEvents,
    RunStatus,
    RunWorkers,
    TrainRunInfo,
)

DEFAULT_PAGE = 50
MAX_STEP = 2**63 - 1  # steps (and event numbers) are non-negative 64-bit integers
RunId = Annotated[str, Path(max_length=256, description="A run's id")]


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


_BAD_REQUEST = "A parameter holds something this API did not make, or the Host header names a host it does not answer"
_UNAUTHORIZED = {"model": Problem, "description": "The bearer token is missing or wrong"}
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": Problem, "description": _BAD_REQUEST},
    503: {"model": Problem, "description": "Run tracking is off, or Ray or the state actor is unreachable"},
}


def create_app(source: Any = None, *, token: str | None = None, allowed_hosts: Iterable[str] | None = None) -> FastAPI:
    """The application.

    ``token``: every API and metrics request must carry ``Authorization: Bearer <token>`` (the page holds no
    data and loads without it); at least 16 characters. ``allowed_hosts``: host names and addresses the server
    answers to besides loopback names; by default any with a token and loopback names only without one (a
    guard against DNS rebinding). ``source``: where runs come from (default: ``RaySource()``, the state actor of
    the Ray cluster this process is connected to). Bad values raise ``ValueError`` saying what to change.
    """
    guard = [] if token is None else [Depends(bearer_dependency(check_token(token)))]
    hosts = HostPolicy.build(allowed_hosts, token_set=token is not None)
    errors = _ERRORS if token is None else {**_ERRORS, 401: _UNAUTHORIZED}
    runs_source = source if source is not None else RaySource()
    metrics = ApiMetrics()
    app = FastAPI(
        title="elastrain dashboard API",
        version=__version__,
        description=(
            "Training runs recorded by elastrain-state: paged, filtered, with live worker status; each run's metric "
            "history, events and departed workers."
        ),
        responses={400: {"model": Problem, "description": "The Host header names a host this server does not answer"}},
    )

    @app.middleware("http")
    async def check_host_and_measure(request: Request, call_next: Any) -> Response:
        started = time.perf_counter()
        host = request.headers.get("host")
        if hosts.allows(host):
            response: Response = await call_next(request)
        else:
            response = JSONResponse({"detail": hosts.refusal(host), "field": "Host"}, status_code=400)
        route = request.scope.get("route")  # None when refused before routing: counted as "unmatched"
        metrics.observe(getattr(route, "path", "unmatched"), response.status_code, time.perf_counter() - started)
        return response

    @app.exception_handler(Unavailable)
    async def unavailable(request: Request, error: Unavailable) -> JSONResponse:
        return JSONResponse({"detail": str(error)}, status_code=503)

    @app.exception_handler(BadRequest)
    async def bad_request(request: Request, error: BadRequest) -> JSONResponse:
        return JSONResponse({"detail": str(error), "field": error.field}, status_code=400)

    @app.get(
        "/api/train/runs",
        response_model=RunsPage,
        responses=errors,
        dependencies=guard,
        summary="List runs, newest first",
    )
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
        responses={**errors, 404: {"model": Problem, "description": "No such run"}},
        dependencies=guard,
        summary="One run with its workers",
    )
    def get_run(run_id: Annotated[str, Path(max_length=256)]) -> Any:
        run = runs_source.get_run(run_id)
        return _no_run(run_id) if run is None else run

    not_found = {**errors, 404: {"model": Problem, "description": "No such run"}}

    @app.get(
        "/api/train/runs/{run_id}/metrics",
        response_model=MetricHistory,
        responses=not_found,
        dependencies=guard,
        summary="A run's metric history, by column, downsampled to at most 1000 points",
    )
    def get_metrics(
        run_id: RunId,
        metric: Annotated[
            list[Annotated[str, Field(max_length=256)]] | None,
            Query(max_length=32, description="Only these metrics (repeat the parameter); all by default"),
        ] = None,
        after_step: Annotated[
            int | None, Query(ge=0, le=MAX_STEP, description="Only points after this step: next_after_step")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_HISTORY_PAGE, description="Points per page")] = MAX_HISTORY_PAGE,
    ) -> Any:
        found = runs_source.get_metrics(run_id, names=metric, after_step=after_step, limit=limit)
        return _no_run(run_id) if found is None else found

    @app.get(
        "/api/train/runs/{run_id}/events",
        response_model=RunEvents,
        responses=not_found,
        dependencies=guard,
        summary="A run's events (resets, world sizes, workers that left, its end), oldest first",
    )
    def get_events(
        run_id: RunId,
        after_seq: Annotated[
            int | None, Query(ge=0, le=MAX_STEP, description="Only events after this seq: next_after_seq")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_HISTORY_PAGE, description="Events per page")] = MAX_HISTORY_PAGE,
    ) -> Any:
        found = runs_source.get_events(run_id, after_seq=after_seq, limit=limit)
        return _no_run(run_id) if found is None else found

    @app.get(
        "/api/train/runs/{run_id}/workers",
        response_model=RunWorkers,
        responses=not_found,
        dependencies=guard,
        summary="A run's workers now and those that left it",
    )
    def get_workers(run_id: RunId) -> Any:
        found = runs_source.get_workers(run_id)
        return _no_run(run_id) if found is None else found

    @app.get("/healthz", response_model=Health, summary="Liveness, and whether Ray and tracking are reachable")
    def health() -> Health:
        try:
            runs_source.info()
            ray_up, tracking = True, True
        except Unavailable as error:
            ray_up, tracking = "Ray" not in str(error), False
        return Health(status="ok", ray=ray_up, tracking=tracking, version=__version__)

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={401: _UNAUTHORIZED} if token is not None else None,
        dependencies=guard,
        summary="Prometheus metrics",
    )
    def prometheus() -> PlainTextResponse:
        try:
            by_status = runs_source.info().get("by_status", {})
        except Unavailable:
            by_status = None
        return PlainTextResponse(metrics.render(by_status), media_type="text/plain; version=0.0.4")

    add_page_routes(app)
    return app


def _no_run(run_id: str) -> JSONResponse:
    return JSONResponse({"detail": f"No run with id {run_id!r}.", "field": "run_id"}, status_code=404)
