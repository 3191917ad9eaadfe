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
from typing import Any

from elastrain.state._private.liveness import Watch
from elastrain.state._private.options import (
    DEFAULT_DRIVER_CHECK_INTERVAL_S,
    DEFAULT_IO_TIMEOUT_S,
    DEFAULT_MAX_RUNS,
    DEFAULT_SNAPSHOT_INTERVAL_S,
    check_max_runs,
    check_seconds,
    check_snapshot_uri,
)
from elastrain.state._private.persistence import Persistence
from elastrain.state._private.schemas import RunMetrics, RunStatus, TrainRunInfo, TrainWorkerInfo
from elastrain.state._private.table import RunTable

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
    ) -> None:
        self.table = RunTable(check_max_runs(max_runs), on_evict=self._evicted)
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
        return self._update(run_id, changes, run, running=True)

    def update_metrics(
        self, run_id: str, step: int | None, values: dict[str, float | None], run: dict[str, Any] | None = None
    ) -> dict[str, Any] | None:
        metrics = RunMetrics(step=step, values=values, time_ms=int(time.time() * 1000))
        return self._update(run_id, {"latest_metrics": metrics}, run)

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
                changes["end_time_ms"] = max(end_time_ms or int(time.time() * 1000), current.start_time_ms)
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

    def info(self) -> dict[str, Any]:
        """Counts, persistence and liveness facts, for health checks and the dashboard's metrics."""
        with self._lock:
            runs, by_status = len(self.table), self.table.count_by_status()
        persistence = None if self._persistence is None else self._persistence.info()
        last = None if persistence is None else persistence["last_write"]
        return {
            "runs": runs,
            "by_status": by_status,
            "max_runs": self.table.max_runs,
            "persistent": persistence is not None,
            "last_snapshot_s": None if last is None else last["seconds"],
            "snapshot": persistence,
            "driver_checks": None if self._watch is None else self._watch.info(),
            "started_at": self.started_at,
            "pid": os.getpid(),
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
        self, run_id: str, changes: dict[str, Any], run: dict[str, Any] | None, running: bool = False
    ) -> dict[str, Any] | None:
        seed = _seed(run_id, run)
        with self._lock:
            current = self._known(run_id, seed)
            if current is None:
                return None
            if running and current.run_status is RunStatus.INITIALIZING:
                changes = {**changes, "run_status": RunStatus.RUNNING}
            return self._put(_replace(current, changes))

    def _known(self, run_id: str, seed: TrainRunInfo | None) -> TrainRunInfo | None:
        """The stored run, or else the caller's view of it (the actor restarted without it)."""
        current = self.table.get(run_id)
        if current is None and seed is not None:
            logger.info("Run %s was unknown (the state actor restarted); stored again from its tracker.", run_id)
            return seed
        return current

    def _put(self, run: TrainRunInfo) -> dict[str, Any]:
        self.table.put(run)
        if self._persistence is not None:
            self._persistence.changed(run.id)
        return run.model_dump(mode="json")

    def _evicted(self, run_id: str) -> None:
        if self._persistence is not None:
            self._persistence.removed(run_id)

    # Called from the persistence thread.
    def _documents(self, run_ids: list[str]) -> dict[str, str | None]:
        with self._lock:
            return {run_id: self.table.get_json(run_id) for run_id in run_ids}

    def _all_documents(self) -> list[str]:
        with self._lock:
            return self.table.all_documents()

    def _restore(self, runs: dict[str, TrainRunInfo], cluster_id: str | None) -> None:
        """Take the loaded runs; a run updated since the restart keeps its newer data (and the stronger status).
        Runs that were going on another Ray cluster (this one is new) are over: their drivers went with it."""
        foreign = cluster_id is not None and cluster_id != _cluster_id()
        with self._lock:
            for run in runs.values():
                current = self.table.get(run.id)
                self.table.put(run if current is None else _merge_status(run, current))
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
            end = max(int(time.time() * 1000), current.start_time_ms)
            self._put(_replace(current, {"run_status": RunStatus.ABORTED, "status_detail": reason, "end_time_ms": end}))
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
