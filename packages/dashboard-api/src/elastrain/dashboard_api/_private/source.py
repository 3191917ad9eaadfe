"""Where the API's data comes from: the cluster's state actor for runs, Ray's actor table for liveness.

A request makes one call to the state actor (found once and kept; looked up again when it has died) and one
point lookup per worker recorded ALIVE and per controller of the runs still going on the page; never a read of
every actor in the cluster. Everything it
asks Ray shares one deadline, so a slow or unreachable cluster gives a 503 in ``timeout_s``, not a hung request.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from elastrain.dashboard_api._private.ray_calls import PRESENT_STATES, BoundedCalls, RayTimeout, actor_states
from elastrain.state import (
    SCHEMA_VERSION,
    MetricHistory,
    RunEvents,
    RunStatus,
    RunWorkers,
    TrainRunInfo,
    TrainWorkerInfo,
    WorkerStatus,
    get_state_actor,
)

DEFAULT_TIMEOUT_S = 10.0
M = TypeVar("M", bound=BaseModel)


class Unavailable(Exception):
    """The data cannot be had right now (HTTP 503); the message says why and what to do."""


class BadRequest(Exception):
    """The request named something this API did not make (HTTP 400); ``field`` names the parameter."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class RaySource:
    """Runs from the state actor of the Ray cluster this process is connected to.

    ``timeout_s``: the most one request waits for Ray in all (finding the state actor, calling it, looking up
    actors) before answering 503.
    """

    def __init__(self, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not math.isfinite(timeout_s):
            raise ValueError(f"timeout_s must be a number of seconds, got {timeout_s!r}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be above 0 seconds, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self._calls = BoundedCalls()
        self._lock = threading.Lock()
        self._actor: Any = None  # found once, kept while it answers: finding it is a GCS round trip

    @property
    def _budget(self) -> str:
        return f" (each request waits at most {self.timeout_s:g} s): check that the cluster is up and not overloaded."

    def list_runs(
        self, *, status: RunStatus | None, job_id: str | None, name: str | None, limit: int, cursor: str | None
    ) -> tuple[list[TrainRunInfo], str | None]:
        deadline = time.monotonic() + self.timeout_s
        documents, next_cursor = self._call(
            deadline, "list_runs", None if status is None else status.value, job_id, name, limit, cursor
        )
        runs = [_parse(document) for document in documents]
        return decorate(runs, self._present(runs, deadline)), next_cursor

    def get_run(self, run_id: str) -> TrainRunInfo | None:
        deadline = time.monotonic() + self.timeout_s
        document = self._call(deadline, "get_run", run_id)
        if document is None:
            return None
        run = _parse(document)
        return decorate([run], self._present([run], deadline))[0]

    def get_metrics(
        self, run_id: str, *, names: list[str] | None, after_step: int | None, limit: int
    ) -> MetricHistory | None:
        document = self._call(time.monotonic() + self.timeout_s, "get_metrics", run_id, names, after_step, limit)
        return None if document is None else _parse_as(MetricHistory, document)

    def get_events(self, run_id: str, *, after_seq: int | None, limit: int) -> RunEvents | None:
        document = self._call(time.monotonic() + self.timeout_s, "get_events", run_id, after_seq, limit)
        return None if document is None else _parse_as(RunEvents, document)

    def get_workers(self, run_id: str) -> RunWorkers | None:
        """The run's workers (decorated as the run routes do) and those that left it."""
        deadline = time.monotonic() + self.timeout_s
        document = self._call(deadline, "get_workers", run_id)
        if document is None:
            return None
        found = _parse_as(RunWorkers, document)
        if found.run_status.is_terminal:
            return found
        alive = self._present_workers({w.actor_id for w in found.workers if w.status is WorkerStatus.ALIVE}, deadline)
        return found.model_copy(update={"workers": [_shown(worker, alive) for worker in found.workers]})

    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = self._call(time.monotonic() + self.timeout_s, "info")
        return info

    def _state_actor(self, deadline: float) -> Any:
        import ray

        if not ray.is_initialized():
            raise Unavailable("Not connected to a Ray cluster; start the dashboard with --address.")
        with self._lock:
            if self._actor is not None:
                return self._actor
        try:
            actor = self._calls.run(get_state_actor, deadline - time.monotonic(), "where the state actor is")
        except RayTimeout as error:
            raise Unavailable(f"The Ray cluster did not answer: {error}{self._budget}") from None
        except Exception as error:
            raise Unavailable(f"The Ray cluster did not answer: {_first_line(error)}") from None
        if actor is None:
            raise Unavailable(
                "Run tracking is off: this cluster has no elastrain state actor. Install elastrain-state where "
                "jobs run (the executor then records runs), or create it with get_or_create_state_actor()."
            )
        with self._lock:
            self._actor = actor
        return actor

    def _call(self, deadline: float, method: str, *args: Any) -> Any:
        import ray

        for attempt in (1, 2):
            actor = self._state_actor(deadline)
            try:
                return ray.get(getattr(actor, method).remote(*args), timeout=max(deadline - time.monotonic(), 0))
            except ray.exceptions.RayTaskError as error:
                cause = getattr(error, "cause", None)
                if isinstance(cause, ValueError):  # e.g. a cursor the actor did not make
                    raise BadRequest("cursor", str(cause)) from None
                raise Unavailable(f"The state actor failed: {_first_line(error)}") from None
            except ray.exceptions.GetTimeoutError:
                raise Unavailable(
                    f"The state actor did not answer within {self.timeout_s:g} s (it may be busy or restarting)."
                ) from None
            except ray.exceptions.ActorDiedError as error:
                # Gone for good (killed, or its node lost): forget it and look it up once more, since another
                # may have taken its name.
                with self._lock:
                    if self._actor is actor:
                        self._actor = None
                if attempt == 2:
                    raise Unavailable(f"The state actor is gone: {_first_line(error)}") from None
            except ray.exceptions.RayActorError as error:
                raise Unavailable(
                    f"The state actor did not answer (it may be restarting): {_first_line(error)}"
                ) from None
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _present(self, runs: list[TrainRunInfo], deadline: float) -> set[str]:
        """The ids, among the workers recorded ALIVE and the controllers of runs still going, of actors alive now,
        and of controllers that are starting or restarting (present too). Ended runs need no lookup: they are
        shown as recorded."""
        going = [run for run in runs if not run.run_status.is_terminal]
        workers = {w.actor_id for run in going for w in run.workers if w.status is WorkerStatus.ALIVE}
        controllers = {run.controller_actor_id for run in going if run.controller_actor_id}
        states = self._states(workers | controllers, deadline)
        alive = {actor_id for actor_id in workers if states.get(actor_id) == "ALIVE"}
        return alive | {actor_id for actor_id in controllers if states.get(actor_id) in PRESENT_STATES}

    def _present_workers(self, workers: set[str], deadline: float) -> set[str]:
        states = self._states(workers, deadline)
        return {actor_id for actor_id in workers if states.get(actor_id) == "ALIVE"}

    def _states(self, actor_ids: set[str], deadline: float) -> dict[str, str]:
        if not actor_ids:
            return {}
        try:
            return self._calls.run(lambda: actor_states(actor_ids), deadline - time.monotonic(), "the actors' states")
        except RayTimeout as error:
            raise Unavailable(f"Ray's actor table did not answer: {error}{self._budget}") from None
        except Exception as error:
            raise Unavailable(f"Ray's actor table did not answer: {_first_line(error)}") from None


def _parse_as(model: type[M], document: Any) -> M:
    """A history page as a model, or 503 saying to install the same version on both sides: never a 500."""
    try:
        return model.model_validate(document)
    except ValidationError as error:
        raise Unavailable(
            f"The state actor returned a {model.__name__} this dashboard cannot read ({_first_problem(error)}): "
            "install the same elastrain-state version here as on the cluster."
        ) from None


def _parse(document: Any) -> TrainRunInfo:
    """A stored run as a model, or 503 saying which side to upgrade: never a 500."""
    version = document.get("schema_version") if isinstance(document, dict) else None
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise Unavailable(
            f"The state actor holds runs of schema version {version}, newer than this dashboard reads "
            f"({SCHEMA_VERSION}): upgrade elastrain-dashboard-api and elastrain-state where the dashboard runs "
            "to the cluster's version."
        )
    try:
        return TrainRunInfo.model_validate(document)
    except ValidationError as error:
        raise Unavailable(
            f"The state actor returned a run this dashboard cannot read ({_first_problem(error)}): install the "
            "same elastrain-state version here as on the cluster."
        ) from None


def decorate(runs: list[TrainRunInfo], alive: set[str]) -> list[TrainRunInfo]:
    """In runs still going, workers recorded ALIVE whose actor is not alive shown DEAD, and a run whose controller
    is gone shown as ABORTED (neither is stored). Ended runs are shown as recorded: their workers say how they
    ended (FINISHED, STOPPED, CRASHED, REMOVED)."""
    shown = []
    for run in runs:
        if run.run_status.is_terminal:
            shown.append(run)
            continue
        changes: dict[str, Any] = {"workers": tuple(_shown(worker, alive) for worker in run.workers)}
        if run.controller_actor_id is not None and run.controller_actor_id not in alive:
            changes["run_status"] = RunStatus.ABORTED
            changes["status_detail"] = "The run's controller is gone (its driver exited without ending the run)."
        shown.append(run.model_copy(update=changes))
    return shown


def _shown(worker: TrainWorkerInfo, alive: set[str]) -> TrainWorkerInfo:
    if worker.status is not WorkerStatus.ALIVE or worker.actor_id in alive:
        return worker
    return worker.model_copy(update={"status": WorkerStatus.DEAD})


def _first_problem(error: ValidationError) -> str:
    problem = error.errors()[0]
    return f"{'.'.join(str(part) for part in problem['loc']) or 'run'}: {problem['msg']}"[:300]


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__
