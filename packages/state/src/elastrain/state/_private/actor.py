"""The state actor: one detached, named actor per cluster holding every run, persisted by default.

Calls carry JSON-ready dicts (not model objects) so that drivers and the actor may run different pydantic
builds; the actor validates everything it stores. Its call thread only touches memory: snapshot I/O and the
check for abandoned runs run on their own threads, and every access to the table holds ``_lock``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from elastrain.state._private.histories import Histories, as_json
from elastrain.state._private.history import RunHistory, events_page, metrics_page
from elastrain.state._private.history_schemas import MAX_HISTORY_PAGE, MAX_STEP, RunEventKind, empty_document
from elastrain.state._private.liveness import Watch
from elastrain.state._private.options import (
    DEFAULT_DRIVER_CHECK_INTERVAL_S,
    DEFAULT_IO_TIMEOUT_S,
    DEFAULT_MAX_HISTORIES,
    DEFAULT_MAX_RUNS,
    DEFAULT_SNAPSHOT_INTERVAL_S,
    check_max_runs,
    check_seconds,
    check_snapshot_uri,
)
from elastrain.state._private.persistence import Persistence
from elastrain.state._private.schemas import (
    SCHEMA_VERSION,
    RunMetrics,
    RunStatus,
    TrainRunInfo,
    TrainWorkerInfo,
    WorkerStatus,
    ended_workers,
)
from elastrain.state._private.table import RunTable
from elastrain.state._version import __version__

logger = logging.getLogger("elastrain.state")

STATE_ACTOR_NAME = "elastrain_state"
STATE_ACTOR_NAMESPACE = "elastrain"


class StateActor:
    """Ray actor class. ``snapshot_uri``: where to persist (a folder or fsspec URI); without one, ``persist``
    picks the embedded default, a folder of this actor's own in the Ray session directory on its node (it
    outlives the actor's restarts; a new actor or a new cluster starts empty)."""

    def __init__(
        self,
        max_runs: int = DEFAULT_MAX_RUNS,
        snapshot_uri: str | None = None,
        snapshot_interval_s: float = DEFAULT_SNAPSHOT_INTERVAL_S,
        *,
        persist: bool = True,
        io_timeout_s: float = DEFAULT_IO_TIMEOUT_S,
        driver_check_interval_s: float = DEFAULT_DRIVER_CHECK_INTERVAL_S,
        max_histories: int = DEFAULT_MAX_HISTORIES,
    ) -> None:
        self.table = RunTable(check_max_runs(max_runs), on_evict=self._evicted)
        self.histories = Histories(check_max_runs(max_histories, "max_histories"))
        interval = check_seconds("snapshot_interval_s", snapshot_interval_s)
        timeout = check_seconds("io_timeout_s", io_timeout_s)
        check_interval = check_seconds("driver_check_interval_s", driver_check_interval_s)
        self._lock = threading.Lock()
        self.started_at = time.time()
        uri = check_snapshot_uri(snapshot_uri) if snapshot_uri is not None else None
        if uri is None and persist:
            uri = _embedded_folder()
        self._persistence: Persistence | None = None
        if uri is not None:
            self._persistence = Persistence(
                uri,
                interval_s=interval,
                timeout_s=timeout,
                documents=self._documents,
                all_documents=self._all_documents,
                restore=self._restore,
                cluster_id=_cluster_id(),
            )
        self._watch = Watch(check_interval, self._live_runs, self._abort) if _in_ray() else None

    # -- writes ----------------------------------------------------------------------------------------------

    def register_run(self, run: dict[str, Any]) -> dict[str, Any]:
        """Store a new run, or update the run with its id (a terminal status is never taken back)."""
        incoming = TrainRunInfo.model_validate(run)
        with self._lock:
            current = self.table.get(incoming.id)
            if current is not None:
                incoming = _merge_status(current, incoming)
            elif incoming.world_size:
                self._event(incoming, RunEventKind.WORLD_SIZE)
            else:
                self._history(incoming)
            return self._put(incoming)

    def update_workers(
        self,
        run_id: str,
        workers: list[dict[str, Any]],
        world_size: int | None = None,
        resets: int | None = None,
        run: dict[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """``run``, in every update: the caller's whole view of the run, stored when the actor does not know the
        run (it restarted without it): an update is never lost. None when the run is unknown and ``run`` absent."""
        parsed = tuple(TrainWorkerInfo.model_validate(worker) for worker in workers)
        changes: dict[str, Any] = {"workers": parsed, "world_size": len(parsed) if world_size is None else world_size}
        if resets is not None:
            changes["resets"] = resets
        return self._update(run_id, changes, run, running=True, then=self._world_changed)

    def update_metrics(
        self, run_id: str, step: int | None, values: dict[str, float | None], run: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """One report: :meth:`append_metrics` with one point, timed now."""
        return self.append_metrics(run_id, [{"step": step, "values": values, "time_ms": _now_ms()}], run)

    def append_metrics(
        self, run_id: str, points: list[dict[str, Any]], run: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """Reports in the order made, each ``{"step": int | None, "values": {name: number}, "time_ms": int}``: into
        the run's metric history, and the last as its ``latest_metrics`` (with the step the history gave it)."""
        parsed = [RunMetrics.model_validate(point) for point in points]
        if not parsed:
            raise ValueError("append_metrics needs at least one point")
        seed = _seed(run_id, run)
        with self._lock:
            current = self._known(run_id, seed)
            if current is None:
                return None
            metrics = self._history(current).metrics
            step: int | None = None
            for point in parsed:
                step = point.step
                if step is None or 0 <= step <= MAX_STEP:  # a step no chart can hold stays out of the history
                    step = metrics.report(step, point.values, point.time_ms)
            latest = parsed[-1].model_copy(update={"step": step})
            return self._put(_replace(current, {"latest_metrics": latest}))

    def worker_exited(
        self,
        run_id: str,
        worker: dict[str, Any],
        status: str,
        detail: str | None = None,
        run: dict[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """A worker left a run that goes on: ``status`` CRASHED (it died, raised or stopped answering) or REMOVED
        (its host left; the job let it go). Recorded as an event; it keeps that status among the run's workers
        until the next world, and then stays among the departed. A worker reported twice counts once."""
        if status not in (WorkerStatus.CRASHED.value, WorkerStatus.REMOVED.value):
            raise ValueError(f"a worker exits 'CRASHED' or 'REMOVED', got {status!r}")
        exit_status = WorkerStatus(status)
        record = TrainWorkerInfo.model_validate({**worker, "status": exit_status})
        seed = _seed(run_id, run)
        with self._lock:
            current = self._known(run_id, seed)
            if current is None:
                return None
            history = self._history(current)
            listed = [w for w in current.workers if w.actor_id == record.actor_id]
            if history.has_departed(record.actor_id) or (listed and listed[0].status is not WorkerStatus.ALIVE):
                return self._put(current) if current is seed else current.model_dump(mode="json")
            history.event(
                RunEventKind.WORKER_EXITED,
                _now_ms(),
                world_size=current.world_size,
                resets=current.resets,
                status=exit_status.value,
                worker=record.model_dump(mode="json"),
                detail=detail,
            )
            if not listed:  # not in the recorded world (it left before the tracker heard of it): departed now
                history.depart(record.model_dump(mode="json"), exit_status.value, _now_ms(), detail)
                return self._put(current)
            workers = [record if w.actor_id == record.actor_id else w for w in current.workers]
            return self._put(_replace(current, {"workers": workers}))

    def set_status(
        self,
        run_id: str,
        status: str,
        detail: str | None = None,
        end_time_ms: int | None = None,
        run: dict[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """Move a run to ``status``; FINISHED and ERRORED are final, and nothing goes back to RUNNING after ABORTED."""
        new = RunStatus(status)
        seed = _seed(run_id, run)
        with self._lock:
            current = self._known(run_id, seed)
            if current is None:
                return None
            if not _may_become(current.run_status, new):
                return self._put(current) if seed is not None and current is seed else current.model_dump(mode="json")
            changes: dict[str, Any] = {"run_status": new, "status_detail": detail}
            if new.is_terminal:
                return self._end(current, changes, end_time_ms)
            return self._put(_replace(current, changes))

    # -- reads -----------------------------------------------------------------------------------------------

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        with self._lock:
            return self.table.get_data(run_id)

    def list_runs(
        self,
        status: str | None = None,
        job_id: str | None = None,
        name: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        wanted = None if status is None else RunStatus(status)
        with self._lock:
            return self.table.page_data(status=wanted, job_id=job_id, name=name, limit=limit, cursor=cursor)

    def get_metrics(
        self,
        run_id: str,
        names: list[str] | None = None,
        after_step: int | None = None,
        limit: int = MAX_HISTORY_PAGE,
    ) -> dict[str, Any] | None:
        """A page of the run's metric history (a ``MetricHistory``), or None for an unknown run."""
        _check_limit(limit)
        return self._history_page(run_id, lambda history: metrics_page(history["metrics"], names, after_step, limit))

    def get_events(
        self, run_id: str, after_seq: int | None = None, limit: int = MAX_HISTORY_PAGE
    ) -> dict[str, Any] | None:
        """A page of the run's events, oldest first (a ``RunEvents``), or None for an unknown run."""
        _check_limit(limit)
        return self._history_page(run_id, lambda history: events_page(history, after_seq, limit))

    def _history_page(self, run_id: str, page_of: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any] | None:
        """``page_of`` the run's history (an empty one once retention dropped it); None for an unknown run."""
        with self._lock:
            if self.table.get_json(run_id) is None:
                return None
            document = self.histories.document(run_id)
            return {"run_id": run_id, **page_of(document or empty_document()), "retained": document is not None}

    def get_workers(self, run_id: str) -> dict[str, Any] | None:
        """The run's workers and those that left it (a ``RunWorkers``), or None for an unknown run."""
        with self._lock:
            run = self.table.get_data(run_id)
            if run is None:
                return None
            document = self.histories.document(run_id)
            history = document or empty_document()
            return {
                "run_id": run_id,
                "run_status": run["run_status"],
                "workers": run["workers"],
                "departed": list(history["departed"]),
                "departed_dropped": history["departed_dropped"],
                "retained": document is not None,
            }

    def info(self) -> dict[str, Any]:
        """Counts, persistence and liveness facts, for health checks and the dashboard's metrics."""
        with self._lock:
            runs, by_status, histories = len(self.table), self.table.count_by_status(), len(self.histories)
        persistence = None if self._persistence is None else self._persistence.info()
        last = None if persistence is None else persistence["last_write"]
        return {
            "runs": runs,
            "by_status": by_status,
            "max_runs": self.table.max_runs,
            "histories": histories,
            "max_histories": self.histories.max_histories,
            "persistent": persistence is not None,
            "last_snapshot_s": None if last is None else last["seconds"],
            "snapshot": persistence,
            "driver_checks": None if self._watch is None else self._watch.info(),
            "started_at": self.started_at,
            "pid": os.getpid(),
            "version": __version__,  # the code it runs: a detached actor outlives upgrades
            "schema_version": SCHEMA_VERSION,
        }

    def flush(self) -> bool:
        """Write what changed now and wait for it (clean shutdowns, tests); False when not persisting. Raises
        when the write fails or outlasts its deadline."""
        if self._persistence is None:
            return False
        self._persistence.flush()
        return True

    # -- internals -------------------------------------------------------------------------------------------

    def _update(
        self,
        run_id: str,
        changes: dict[str, Any],
        run: dict[str, Any] | None,
        running: bool = False,
        then: Callable[[TrainRunInfo, TrainRunInfo], None] | None = None,
    ) -> dict[str, Any] | None:
        """Apply ``changes``; ``then(before, after)`` runs under the lock before the run is stored."""
        seed = _seed(run_id, run)
        with self._lock:
            current = self._known(run_id, seed)
            if current is None:
                return None
            if running and current.run_status is RunStatus.INITIALIZING:
                changes = {**changes, "run_status": RunStatus.RUNNING}
            updated = _replace(current, changes)
            if then is not None:
                then(current, updated)
            return self._put(updated)

    def _world_changed(self, before: TrainRunInfo, after: TrainRunInfo) -> None:
        """Events of a new world: the workers that left it (REMOVED unless reported otherwise), a reset, a new size."""
        history = self._history(after)
        now = _now_ms()
        staying = {worker.actor_id for worker in after.workers}
        for worker in before.workers:
            if worker.actor_id in staying or history.has_departed(worker.actor_id):
                continue
            if worker.status is WorkerStatus.ALIVE:  # no one said why: the job let it go
                worker = worker.model_copy(update={"status": WorkerStatus.REMOVED})
                history.event(
                    RunEventKind.WORKER_EXITED,
                    now,
                    world_size=after.world_size,
                    resets=after.resets,
                    status=worker.status.value,
                    worker=worker.model_dump(mode="json"),
                )
            exited = _last_exit(history, worker.actor_id)
            history.depart(
                worker.model_dump(mode="json"),
                worker.status.value,
                now if exited is None else exited["time_ms"],
                None if exited is None else exited["detail"],
            )
        if after.resets > before.resets:
            history.event(RunEventKind.RESET, now, world_size=after.world_size, resets=after.resets)
        if after.world_size != before.world_size:
            history.event(RunEventKind.WORLD_SIZE, now, world_size=after.world_size, resets=after.resets)

    def _end(self, current: TrainRunInfo, changes: dict[str, Any], end_time_ms: int | None) -> dict[str, Any]:
        """End the run: its workers still in the world end with it, and a RUN_ENDED event says how."""
        status: RunStatus = changes["run_status"]
        workers = ended_workers([w.model_dump(mode="json") for w in current.workers], status)
        end = max(end_time_ms or _now_ms(), current.start_time_ms)
        ended = _replace(current, {**changes, "end_time_ms": end, "workers": workers})
        detail = changes.get("status_detail")
        self._event(ended, RunEventKind.RUN_ENDED, status=status.value, detail=detail)
        return self._put(ended)

    def _history(self, run: TrainRunInfo) -> RunHistory:
        history, dropped = self.histories.open(run.id, run.start_time_ms)
        for run_id in dropped:  # their stored documents lose their histories
            self._changed(run_id)
        return history

    def _event(self, run: TrainRunInfo, kind: RunEventKind, **fields: Any) -> None:
        self._history(run).event(kind, _now_ms(), world_size=run.world_size, resets=run.resets, **fields)

    def _known(self, run_id: str, seed: TrainRunInfo | None) -> TrainRunInfo | None:
        """The stored run, or else the caller's view of it (the actor restarted without it)."""
        current = self.table.get(run_id)
        if current is None and seed is not None:
            logger.info("Run %s was unknown (the state actor restarted); stored again from its tracker.", run_id)
            return seed
        return current

    def _put(self, run: TrainRunInfo) -> dict[str, Any]:
        self.table.put(run)
        if run.run_status.is_terminal:
            self.histories.end(run.id)
        self._changed(run.id)
        return run.model_dump(mode="json")

    def _changed(self, run_id: str) -> None:
        if self._persistence is not None:
            self._persistence.changed(run_id)

    def _evicted(self, run_id: str) -> None:
        self.histories.drop(run_id)
        if self._persistence is not None:
            self._persistence.removed(run_id)

    # Called from the persistence thread. Live histories are copied under the lock and serialized after it, so
    # a round never holds up calls for longer than the copies take.
    def _documents(self, run_ids: list[str]) -> dict[str, str | None]:
        with self._lock:
            parts = {run_id: (self.table.get_json(run_id), self.histories.copy(run_id)) for run_id in run_ids}
        return {run_id: _with_history(*part) for run_id, part in parts.items()}

    def _all_documents(self) -> list[str]:
        with self._lock:
            parts = [(self.table.get_json(run_id), self.histories.copy(run_id)) for run_id in self.table.ids()]
        return [document for part in parts if (document := _with_history(*part)) is not None]

    def _restore(self, runs: dict[str, TrainRunInfo], cluster_id: str | None, histories: dict[str, RunHistory]) -> None:
        """Take the loaded runs; a run updated since the restart keeps its newer data (and the stronger status),
        and what its history recorded since is added to the loaded one. Runs that were going on another Ray
        cluster (this one is new) are over: their drivers went with it."""
        foreign = cluster_id is not None and cluster_id != _cluster_id()
        with self._lock:
            for run in runs.values():
                current = self.table.get(run.id)
                stored = run if current is None else _merge_status(run, current)
                loaded = histories.get(run.id)
                if loaded is not None:
                    ended = stored.run_status.is_terminal
                    for dropped in self.histories.restore(run.id, loaded, run.start_time_ms, ended):
                        self._changed(dropped)
                self.table.put(stored)
        if foreign:
            for run in runs.values():
                if not run.run_status.is_terminal:
                    self._abort(run.id, f"The run was going on another Ray cluster ({cluster_id}), which is gone.")

    # Called from the liveness thread.
    def _live_runs(self) -> list[TrainRunInfo]:
        with self._lock:
            return self.table.live()

    def _abort(self, run_id: str, reason: str) -> bool:
        with self._lock:
            current = self.table.get(run_id)
            if current is None or current.run_status.is_terminal:
                return False
            logger.info("Run %s is ABORTED: %s", run_id, reason)
            self._end(current, {"run_status": RunStatus.ABORTED, "status_detail": reason}, None)
            return True


def _in_ray() -> bool:
    import ray

    return bool(ray.is_initialized())


def _cluster_id() -> str | None:
    import ray

    if not ray.is_initialized():
        return None
    worker: Any = ray._private.worker.global_worker
    return str(worker.gcs_client.cluster_id.hex())


def _embedded_folder() -> str | None:
    """This actor's folder in the Ray session directory (None outside a Ray actor: nothing to persist for)."""
    import ray

    if not ray.is_initialized():
        return None
    actor_id = ray.get_runtime_context().get_actor_id()
    if actor_id is None:
        return None
    try:
        worker: Any = ray._private.worker.global_worker
        session = str(worker.node.get_session_dir_path())
    except Exception:  # no node object in this process: the user's cache folder instead
        session = os.path.join(os.path.expanduser("~"), ".cache", "elastrain")
    return os.path.join(session, "elastrain-state", actor_id)


def _with_history(run: str | None, history: str | dict[str, Any] | None) -> str | None:
    """A run's JSON document with its history spliced in (no model is built to write either)."""
    if run is None or history is None:
        return run
    return f'{run[:-1]},"history":{as_json(history)}}}'


def _now_ms() -> int:
    return int(time.time() * 1000)


def _check_limit(limit: Any) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_HISTORY_PAGE:
        raise ValueError(f"limit must be an int from 1 to {MAX_HISTORY_PAGE}, got {limit!r}.")


def _last_exit(history: RunHistory, actor_id: str) -> dict[str, Any] | None:
    """The newest WORKER_EXITED event of this worker still kept, if any."""
    event: dict[str, Any]
    for event in reversed(history.events):
        worker = event.get("worker")
        if event["kind"] == RunEventKind.WORKER_EXITED.value and worker and worker["actor_id"] == actor_id:
            return event
    return None


def _seed(run_id: str, run: dict[str, Any] | None) -> TrainRunInfo | None:
    if run is None:
        return None
    seed = TrainRunInfo.model_validate(run)
    if seed.id != run_id:
        raise ValueError(f"the run given with an update of {run_id!r} is run {seed.id!r}: pass the same run's view")
    return seed


def _may_become(current: RunStatus, new: RunStatus) -> bool:
    if current.is_final:
        return False
    if current is RunStatus.ABORTED:
        return new.is_final  # a late FINISHED or ERRORED is the truth; a late RUNNING is not
    return True


def _merge_status(current: TrainRunInfo, incoming: TrainRunInfo) -> TrainRunInfo:
    if _may_become(current.run_status, incoming.run_status):
        return incoming
    return _replace(
        incoming,
        {"run_status": current.run_status, "status_detail": current.status_detail, "end_time_ms": current.end_time_ms},
    )


def _replace(run: TrainRunInfo, changes: dict[str, Any]) -> TrainRunInfo:
    """A changed copy, validated again (``model_copy(update=...)`` would skip validation)."""
    return TrainRunInfo.model_validate({**run.model_dump(), **changes})
