"""The driver side: record one run in the state actor. Tracking never fails or slows a training job.

Updates are sent without waiting (Ray keeps one caller's calls to an actor in order); failures are looked at
when the run ends, with a bounded wait, and reported with one warning per process.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from elastrain.state._private.history_schemas import MAX_STEP
from elastrain.state._private.schemas import (
    ID_MAX_CHARS,
    MAX_METRICS,
    NAME_MAX_CHARS,
    SCHEMA_VERSION,
    RunMetrics,
    RunStatus,
    TrainDatasetInfo,
    TrainRunInfo,
    TrainWorkerInfo,
    WorkerStatus,
    truncate_detail,
)

logger = logging.getLogger("elastrain.state")
_END_WAIT_S = 5.0
_warned = False


def _warn_once(message: str, *args: Any) -> None:
    global _warned
    if not _warned:
        _warned = True
        logger.warning(message + " Training goes on untracked.", *args)


class RunTracker:
    """Tracks one run: ``start(workers)``, ``set_workers(...)`` after elastic resizes, ``report_metrics``,
    ``worker_exited`` when one leaves, then ``finish()``, ``fail(rank, trace)`` or ``abort(reason)``.

    ``run_id``: the id the run is recorded by (default: a new one; never reuse one).
    ``actor``: the state actor to write to (default: the cluster's, created if absent, unless
    ``create_actor=False``, in which case an absent actor means no tracking).

    The tracker keeps its own view of the run and sends it with every update, so that a state actor that
    restarted without the run stores it again instead of dropping the update.
    """

    def __init__(
        self,
        name: str,
        *,
        run_id: str | None = None,
        job_id: str | None = None,
        controller_actor_id: str | None = None,
        min_workers: int | None = None,
        max_workers: int | None = None,
        datasets: Iterable[TrainDatasetInfo | Mapping[str, Any]] = (),
        actor: Any = None,
        create_actor: bool = True,
    ) -> None:
        _check_text("name", name, NAME_MAX_CHARS)
        for field, value in (("run_id", run_id), ("job_id", job_id), ("controller_actor_id", controller_actor_id)):
            if value is not None:
                _check_text(field, value, ID_MAX_CHARS)
        self.run_id = run_id or uuid.uuid4().hex  # unique per run; never a job id, never reused
        self.name = name
        self._job_id = job_id
        self._controller = controller_actor_id
        self._min_workers, self._max_workers = min_workers, max_workers
        self._datasets = tuple(TrainDatasetInfo.model_validate(d) for d in datasets)
        self._actor = actor
        self._create_actor = create_actor
        self._pending: list[Any] = []
        self._ended = False
        # The run as this tracker last described it, JSON-ready. Built from validated parts and changed in place
        # of being validated whole again: an update costs the same with 4 workers or 1,000.
        self._view: dict[str, Any] | None = None

    def start(self, workers: Sequence[TrainWorkerInfo | Mapping[str, Any]] = ()) -> None:
        parsed = tuple(TrainWorkerInfo.model_validate(w) for w in workers)
        run = TrainRunInfo(
            name=self.name,
            id=self.run_id,
            job_id=self._job_id or _current_job_id(),
            controller_actor_id=self._controller,
            workers=parsed,
            datasets=self._datasets,
            run_status=RunStatus.RUNNING if parsed else RunStatus.INITIALIZING,
            start_time_ms=_now_ms(),
            min_workers=self._min_workers,
            max_workers=self._max_workers,
            world_size=len(parsed),
        )
        self._view = run.model_dump(mode="json")
        self._send("register_run", self._view)

    def set_workers(
        self,
        workers: Sequence[TrainWorkerInfo | Mapping[str, Any]],
        *,
        world_size: int | None = None,
        resets: int | None = None,
    ) -> None:
        records = [TrainWorkerInfo.model_validate(w).model_dump(mode="json") for w in workers]
        changes: dict[str, Any] = {"workers": records, "world_size": len(records) if world_size is None else world_size}
        if resets is not None:
            changes["resets"] = resets
        if self._view is not None and self._view["run_status"] == RunStatus.INITIALIZING.value:
            changes["run_status"] = RunStatus.RUNNING.value
        self._send("update_workers", self.run_id, records, world_size, resets, self._seen(changes))

    def report_metrics(self, step: int | None = None, **values: float) -> None:
        """Report scalars (at most 32; names of at most NAME_MAX_CHARS characters) at ``step`` (an int from 0 to
        2**63 - 1; without one, the step after the previous report's): the run's latest metrics, and a point of its
        metric history. One call to the state actor, sent without waiting."""
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP):
            raise ValueError(f"step must be an int from 0 to {MAX_STEP} or None, got {step!r}.")
        metrics = RunMetrics(step=step, values=dict(values), time_ms=_now_ms())  # bad input raises here, clearly
        self._report([metrics.model_dump(mode="json")])

    def worker_exited(
        self, worker: TrainWorkerInfo | Mapping[str, Any], status: str, detail: str | None = None
    ) -> None:
        """``worker`` left the run while it goes on: ``status`` ``"CRASHED"`` (it died, raised or stopped
        answering) or ``"REMOVED"`` (its host left, or the job let it go); ``detail`` says why. The run records
        the event and lists the worker among the departed once the next world no longer has it."""
        if status not in (WorkerStatus.CRASHED.value, WorkerStatus.REMOVED.value):
            raise ValueError(f"status must be 'CRASHED' or 'REMOVED', got {status!r}.")
        record = TrainWorkerInfo.model_validate(worker).model_dump(mode="json")
        self._send("worker_exited", self.run_id, record, status, detail, self._view)

    def _report(self, points: list[dict[str, Any]]) -> None:
        """Several reports (validated ``RunMetrics`` documents) in one call."""
        if points:
            seen = self._seen({"latest_metrics": points[-1]})
            self._send("append_metrics", self.run_id, points, seen)

    def finish(self) -> None:
        self._end(RunStatus.FINISHED, None)

    def fail(self, detail: str, rank: int | None = None) -> None:
        """ERRORED; ``detail`` is the trace (kept to a bounded size, head and tail)."""
        self._end(RunStatus.ERRORED, detail if rank is None else f"Rank {rank} worker raised an error:\n{detail}")

    def abort(self, reason: str) -> None:
        self._end(RunStatus.ABORTED, reason)

    def _end(self, status: RunStatus, detail: str | None) -> None:
        if self._ended:
            return
        self._ended = True
        end = _now_ms()
        changes: dict[str, Any] = {
            "run_status": status.value,
            "status_detail": None if detail is None else truncate_detail(detail),
        }
        if self._view is not None:
            changes["end_time_ms"] = max(end, self._view["start_time_ms"])
        self._send("set_status", self.run_id, status.value, detail, end, self._seen(changes))
        self._settle()

    def _seen(self, changes: dict[str, Any]) -> dict[str, Any] | None:
        """Apply ``changes`` (JSON-ready, validated) to this tracker's view of the run; the view (None before
        ``start``)."""
        if self._view is None:
            return None
        self._view = {**self._view, **changes}
        return self._view

    def _send(self, method: str, *args: Any) -> None:
        actor = self._state_actor()
        if actor is None:
            return
        try:
            self._pending.append(getattr(actor, method).remote(*args))
        except Exception as error:
            _warn_once("Run tracking failed (%s).", error)
            return
        if len(self._pending) > 64:
            self._settle(timeout_s=0)

    def _settle(self, timeout_s: float = _END_WAIT_S) -> None:
        """Look at the outcome of updates sent so far (waiting at most ``timeout_s``); warn once on failure."""
        import ray

        if not self._pending:
            return
        done, self._pending = ray.wait(self._pending, num_returns=len(self._pending), timeout=timeout_s)
        for ref in done:
            try:
                ray.get(ref)
            except Exception as error:
                _warn_once("%s", self._refused(error))
                break

    def _refused(self, error: BaseException) -> str:
        """Why the state actor refused an update; where it runs an older elastrain-state, both versions and what
        to do (a detached actor keeps the code it started with across upgrades)."""
        if _warned:
            return ""  # said once already: no need to ask the actor again
        import ray

        from elastrain.state._version import __version__

        # Its own words may not arrive: pydantic 2.5 (the floor) cannot unpickle its ValidationError, and Ray then
        # says only "Failed to unpickle serialized exception". So its versions are asked for in every case.
        try:
            info: dict[str, Any] | None = ray.get(self._actor.info.remote(), timeout=_END_WAIT_S)
        except Exception:  # it answers nothing more: say what it can
            info = None
        older = info is not None and int(info.get("schema_version", 1)) < SCHEMA_VERSION
        if not older and "newer than this elastrain-state" not in str(error):
            return f"The state actor did not take a run update ({error})."
        theirs = "an older elastrain-state"
        if info is not None:
            theirs = f"elastrain-state {info.get('version', 'before 0.1.0')} (schema {info.get('schema_version', 1)})"
        return (
            f"The cluster's state actor runs {theirs}, older than this driver's elastrain-state {__version__} (schema "
            f"{SCHEMA_VERSION}), so it cannot store this run. A detached actor keeps the code it started with: restart "
            "it with ray.kill(elastrain.state.get_state_actor(), no_restart=True) (the next run creates it anew, and "
            "it reloads the recorded runs from its snapshot), or run this driver with the actor's elastrain-state."
        )

    def _state_actor(self) -> Any:
        if self._actor is None:
            try:
                from elastrain.state._private.client import get_or_create_state_actor, get_state_actor

                self._actor = get_or_create_state_actor() if self._create_actor else get_state_actor()
            except Exception as error:
                _warn_once("No state actor is reachable (%s).", error)
                self._actor = False
        return self._actor or None


def _check_text(field: str, value: Any, limit: int) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{field} must be a non-empty string, got {value!r}.")
    if len(value) > limit:
        raise ValueError(f"{field} has {len(value)} characters; use at most {limit}.")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _current_job_id() -> str:
    import ray

    try:
        return str(ray.get_runtime_context().get_job_id())
    except Exception:
        return "unknown"


class ExecutorObserver:
    """The ``elastrain.executor.observers`` entry point: records every executor run through a RunTracker."""

    def start_run(self, run: Mapping[str, Any]) -> _ExecutorRun:
        tracker = RunTracker(
            str(run.get("name") or "run")[:NAME_MAX_CHARS],  # a long qualified name is cut, never refused
            run_id=run.get("id"),
            job_id=run.get("job_id"),
            controller_actor_id=run.get("controller_actor_id"),
            min_workers=run.get("min_workers"),
            max_workers=run.get("max_workers"),
        )
        tracker.start(run.get("workers") or [])
        return _ExecutorRun(tracker)


class _ExecutorRun:
    def __init__(self, tracker: RunTracker) -> None:
        self.tracker = tracker

    def workers_changed(self, workers: list[dict[str, Any]], world_size: int, resets: int) -> None:
        self.tracker.set_workers(workers, world_size=world_size, resets=resets)

    def metrics(self, points: list[dict[str, Any]]) -> None:
        """What workers sent as metrics since the last call (the executor calls at most about once a second), as
        ``{"step", "values", "time_ms"}``; cut to what a run holds instead of refused: a job never fails for it."""
        self.tracker._report([point for point in map(_fitting_point, points) if point is not None])

    def event(self, kind: str, fields: dict[str, Any]) -> None:
        if kind == "worker_exited":
            self.tracker.worker_exited(fields["worker"], fields["status"], fields.get("detail"))

    def finished(self) -> None:
        self.tracker.finish()

    def failed(self, detail: str) -> None:
        self.tracker.fail(detail)


def _fitting_point(point: Mapping[str, Any]) -> dict[str, Any] | None:
    """A report as a ``RunMetrics`` document: the first MAX_METRICS numbers with names of a fitting length; None
    when its step is out of range or nothing is left."""
    step = point.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP):
        return None
    values: dict[str, float | None] = {}
    for name, value in point.get("values", {}).items():
        if isinstance(name, str) and len(name) <= NAME_MAX_CHARS and _is_number(value):
            values[name] = value
            if len(values) == MAX_METRICS:
                break
    if not values:
        return None
    time_ms = point.get("time_ms")
    if not isinstance(time_ms, int) or isinstance(time_ms, bool) or time_ms < 0:
        time_ms = _now_ms()
    return RunMetrics(step=step, values=values, time_ms=time_ms).model_dump(mode="json")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
