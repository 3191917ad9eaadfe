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

from elastrain.state._private.schemas import (
    ID_MAX_CHARS,
    NAME_MAX_CHARS,
    RunMetrics,
    RunStatus,
    TrainDatasetInfo,
    TrainRunInfo,
    TrainWorkerInfo,
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
    """Tracks one run: ``start(workers)``, ``set_workers(...)`` after elastic resizes, ``report_metrics``, then
    ``finish()``, ``fail(rank, trace)`` or ``abort(reason)``.

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
        """The latest step and scalars (at most 32; names of at most NAME_MAX_CHARS characters)."""
        metrics = RunMetrics(step=step, values=dict(values), time_ms=_now_ms())  # bad input raises here, clearly
        seen = self._seen({"latest_metrics": metrics.model_dump(mode="json")})
        self._send("update_metrics", self.run_id, step, values, seen)

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
                _warn_once("The state actor did not take a run update (%s).", error)
                break

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

    def finished(self) -> None:
        self.tracker.finish()

    def failed(self, detail: str) -> None:
        self.tracker.fail(detail)
