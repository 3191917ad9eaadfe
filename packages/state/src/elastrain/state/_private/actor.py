"""The state actor: one detached, named actor per cluster holding every run, optionally snapshotted.

Calls carry JSON-ready dicts (not model objects) so that drivers and the actor may run different pydantic
builds; the actor validates everything it stores.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from elastrain.state._private.schemas import RunMetrics, RunStatus, TrainRunInfo, TrainWorkerInfo
from elastrain.state._private.snapshot import Snapshots
from elastrain.state._private.table import RunTable

logger = logging.getLogger("elastrain.state")

STATE_ACTOR_NAME = "elastrain_state"
STATE_ACTOR_NAMESPACE = "elastrain"
DEFAULT_MAX_RUNS = 10_000
DEFAULT_SNAPSHOT_INTERVAL_S = 5.0
# Where snapshots go when persistence is on and no URI is given (on the head node, where the actor runs).
DEFAULT_SNAPSHOT_DIR = os.path.join(os.path.expanduser("~"), ".cache", "elastrain", "state")


class StateActor:
    """Ray actor class. Changes are batched into a snapshot every ``snapshot_interval_s`` (when persisting)."""

    def __init__(
        self,
        max_runs: int = DEFAULT_MAX_RUNS,
        snapshot_uri: str | None = None,
        snapshot_interval_s: float = DEFAULT_SNAPSHOT_INTERVAL_S,
    ) -> None:
        self.table = RunTable(max_runs)
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()  # one snapshot write at a time, so an older one never lands last
        self._dirty = False
        self._snapshots = Snapshots(snapshot_uri) if snapshot_uri else None
        self._interval = snapshot_interval_s
        self.started_at = time.time()
        if self._snapshots is not None:
            for run in self._snapshots.load():
                self.table.put(run)
            threading.Thread(target=self._snapshot_loop, name="elastrain-state-snapshots", daemon=True).start()

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
        self, run_id: str, workers: list[dict[str, Any]], world_size: int | None = None, resets: int | None = None
    ) -> dict[str, Any] | None:
        parsed = tuple(TrainWorkerInfo.model_validate(worker) for worker in workers)
        changes: dict[str, Any] = {"workers": parsed, "world_size": len(parsed) if world_size is None else world_size}
        if resets is not None:
            changes["resets"] = resets
        return self._update(run_id, changes, running=True)

    def update_metrics(self, run_id: str, step: int | None, values: dict[str, float | None]) -> dict[str, Any] | None:
        metrics = RunMetrics(step=step, values=values, time_ms=int(time.time() * 1000))
        return self._update(run_id, {"latest_metrics": metrics})

    def set_status(
        self, run_id: str, status: str, detail: str | None = None, end_time_ms: int | None = None
    ) -> dict[str, Any] | None:
        """Move a run to ``status``; FINISHED and ERRORED are final, and nothing goes back to RUNNING after ABORTED."""
        new = RunStatus(status)
        with self._lock:
            current = self.table.get(run_id)
            if current is None:
                return None
            if not _may_become(current.run_status, new):
                return current.model_dump(mode="json")
            changes: dict[str, Any] = {"run_status": new, "status_detail": detail}
            if new.is_terminal:
                changes["end_time_ms"] = max(end_time_ms or int(time.time() * 1000), current.start_time_ms)
            return self._put(_replace(current, changes))

    # -- reads -----------------------------------------------------------------------------------------------

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        return self.table.get_data(run_id)

    def list_runs(
        self,
        status: str | None = None,
        job_id: str | None = None,
        name: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        return self.table.page_data(
            status=None if status is None else RunStatus(status), job_id=job_id, name=name, limit=limit, cursor=cursor
        )

    def info(self) -> dict[str, Any]:
        """Counts and snapshot facts, for health checks and the dashboard's metrics."""
        return {
            "runs": len(self.table),
            "by_status": self.table.count_by_status(),
            "max_runs": self.table.max_runs,
            "persistent": self._snapshots is not None,
            "last_snapshot_s": None if self._snapshots is None else self._snapshots.last_write_s,
            "started_at": self.started_at,
            "pid": os.getpid(),
        }

    def flush(self) -> bool:
        """Write the snapshot now (tests and clean shutdowns); False when not persisting."""
        if self._snapshots is None:
            return False
        self._write_snapshot()
        return True

    # -- internals -------------------------------------------------------------------------------------------

    def _update(self, run_id: str, changes: dict[str, Any], running: bool = False) -> dict[str, Any] | None:
        with self._lock:
            current = self.table.get(run_id)
            if current is None:
                return None
            if running and current.run_status is RunStatus.INITIALIZING:
                changes = {**changes, "run_status": RunStatus.RUNNING}
            return self._put(_replace(current, changes))

    def _put(self, run: TrainRunInfo) -> dict[str, Any]:
        self.table.put(run)
        self._dirty = True
        return run.model_dump(mode="json")

    def _snapshot_loop(self) -> None:
        while True:
            time.sleep(self._interval)
            if self._dirty:
                try:
                    self._write_snapshot()
                except Exception as error:  # the next round tries again
                    logger.warning("Writing the state snapshot failed: %s", error)

    def _write_snapshot(self) -> None:
        if self._snapshots is None:
            return
        with self._write_lock:
            with self._lock:
                documents = self.table.all_documents()
                self._dirty = False
            try:
                self._snapshots.write(documents)
            except BaseException:
                self._dirty = True  # the next round writes it again
                raise


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
