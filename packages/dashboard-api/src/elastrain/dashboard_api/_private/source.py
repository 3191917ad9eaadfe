"""Where the API's data comes from: the cluster's state actor for runs, Ray's actor table for liveness.

Each request makes at most one call to the state actor and one query of Ray's actor table (every live actor at
once), however many workers a page holds.
"""

from __future__ import annotations

from typing import Any

from elastrain.state import ActorStatus, RunStatus, TrainRunInfo, TrainWorkerInfo, get_state_actor

_CALL_TIMEOUT_S = 10.0


class Unavailable(Exception):
    """The data cannot be had right now (HTTP 503); the message says why and what to do."""


class BadRequest(Exception):
    """The request named something this API did not make (HTTP 400); ``field`` names the parameter."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class RaySource:
    """Runs from the state actor of the Ray cluster this process is connected to."""

    def _actor(self) -> Any:
        import ray

        if not ray.is_initialized():
            raise Unavailable("Not connected to a Ray cluster; start the dashboard with --address.")
        try:
            actor = get_state_actor()
        except Exception as error:
            raise Unavailable(f"The Ray cluster did not answer: {_first_line(error)}") from None
        if actor is None:
            raise Unavailable(
                "Run tracking is off: this cluster has no elastrain state actor. Install elastrain-state where "
                "jobs run (the executor then records runs), or create it with get_or_create_state_actor()."
            )
        return actor

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        import ray

        actor = self._actor()
        try:
            return ray.get(getattr(actor, method).remote(*args, **kwargs), timeout=_CALL_TIMEOUT_S)
        except ray.exceptions.RayTaskError as error:
            cause = getattr(error, "cause", None)
            if isinstance(cause, ValueError):  # e.g. a cursor the actor did not make
                raise BadRequest("cursor", str(cause)) from None
            raise Unavailable(f"The state actor failed: {_first_line(error)}") from None
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as error:
            raise Unavailable(f"The state actor did not answer (it may be restarting): {_first_line(error)}") from None

    def list_runs(
        self, *, status: RunStatus | None, job_id: str | None, name: str | None, limit: int, cursor: str | None
    ) -> tuple[list[TrainRunInfo], str | None]:
        documents, next_cursor = self._call(
            "list_runs", None if status is None else status.value, job_id, name, limit, cursor
        )
        runs = [TrainRunInfo.model_validate(document) for document in documents]
        return decorate(runs, self.alive_actor_ids(runs)), next_cursor

    def get_run(self, run_id: str) -> TrainRunInfo | None:
        document = self._call("get_run", run_id)
        if document is None:
            return None
        run = TrainRunInfo.model_validate(document)
        return decorate([run], self.alive_actor_ids([run]))[0]

    def info(self) -> dict[str, Any]:
        info: dict[str, Any] = self._call("info")
        return info

    def alive_actor_ids(self, runs: list[TrainRunInfo]) -> set[str]:
        """The ids, among these runs' workers and controllers, of actors alive now (one query for all of them),
        and of controllers that are starting or restarting (present too)."""
        wanted = {w.actor_id for run in runs for w in run.workers}
        wanted |= {run.controller_actor_id for run in runs if run.controller_actor_id}
        if not wanted:
            return set()
        from ray._private.state import state  # the GCS actor table: no dashboard process needed

        try:
            found = wanted & set(state.actor_table(None, actor_state_name="ALIVE"))
            starting = {run.controller_actor_id for run in runs if run.controller_actor_id} - found
            for not_yet in _STARTING_STATES if starting else ():
                # A controller that is not alive yet (the executor starts it without waiting) is not gone.
                found |= starting & set(state.actor_table(None, actor_state_name=not_yet))
        except Exception as error:
            raise Unavailable(f"Ray's actor table did not answer: {_first_line(error)}") from None
        return found


# Ray's actor states before ALIVE, and while it comes back: a controller in one of them is present.
_STARTING_STATES = ("DEPENDENCIES_UNREADY", "PENDING_CREATION", "RESTARTING")


def decorate(runs: list[TrainRunInfo], alive: set[str]) -> list[TrainRunInfo]:
    """Workers marked ALIVE or DEAD; a RUNNING run whose controller is gone shown as ABORTED (not stored)."""
    shown = []
    for run in runs:
        workers = tuple(
            _with_status(w, ActorStatus.ALIVE if w.actor_id in alive else ActorStatus.DEAD) for w in run.workers
        )
        changes: dict[str, Any] = {"workers": workers}
        controller_gone = run.controller_actor_id is not None and run.controller_actor_id not in alive
        if not run.run_status.is_terminal and controller_gone:
            changes["run_status"] = RunStatus.ABORTED
            changes["status_detail"] = "The run's controller is gone (its driver exited without ending the run)."
        shown.append(run.model_copy(update=changes))
    return shown


def _with_status(worker: TrainWorkerInfo, status: ActorStatus) -> TrainWorkerInfo:
    return worker if worker.status is status else worker.model_copy(update={"status": status})


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__
