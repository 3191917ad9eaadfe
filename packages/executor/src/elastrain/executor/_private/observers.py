"""Run observers: packages such as elastrain-state watch the executor's runs through an entry point.

A run's record carries its ``id``: the executor's ``last_run_id``, which trackers should record it by.
A package registers a factory in the ``elastrain.executor.observers`` entry-point group. The factory (called
with no arguments) returns an observer whose ``start_run(run)`` returns a handle with ``workers_changed(workers,
world_size, resets)``, ``finished()`` and ``failed(detail)``, and optionally:

- ``metrics(points)``: what workers ``send()`` that counts as metrics (see ``metric_reports``), as
  ``{"step": int | None, "values": {name: float}, "time_ms": int}`` in the order received, batched: at most about
  once a second, and before every other call. With such an observer, messages reach the driver even when the
  call has no callbacks.
- ``event(kind, fields)``: ``"worker_exited"`` with ``{"worker": <worker record>, "status": "CRASHED" |
  "REMOVED", "detail": str}`` when a worker of the run's world crashed (died, raised, or stopped answering and
  was evicted) or was let go (its host left) while the run goes on. Other kinds may come later: ignore them.

Observers without them keep working. Everything passed is plain dicts and strings, so the executor imports
nothing of the observer's. Calls to one run's handles never overlap. An observer that raises is dropped with one
warning: watching a job must never fail it. ``ELASTRAIN_TRACKING=0`` turns observers off.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from elastrain.executor._private.metric_reports import metric_report

logger = logging.getLogger("elastrain.executor")

ENTRY_POINT_GROUP = "elastrain.executor.observers"
TRACKING_ENV = "ELASTRAIN_TRACKING"
_OFF = {"0", "false", "no", "off"}

_factories: list[Any] | None = None  # loaded once per process
# Metric points go to observers this often at most, so a job sending every few milliseconds costs the tracker one
# call a second; between deliveries at most MAX_PENDING_POINTS wait (beyond, the oldest are dropped).
METRICS_INTERVAL_S = 1.0
MAX_PENDING_POINTS = 10_000


def tracking_enabled() -> bool:
    return os.environ.get(TRACKING_ENV, "1").strip().lower() not in _OFF


def _load_factories() -> list[Any]:
    global _factories
    if _factories is None:
        from importlib.metadata import entry_points

        loaded = []
        for entry_point in entry_points(group=ENTRY_POINT_GROUP):
            try:
                loaded.append(entry_point.load())
            except Exception as error:
                logger.warning("Run observer %s could not be loaded (%s); runs go unobserved.", entry_point, error)
        _factories = loaded
    return _factories


class RunWatch:
    """The observers of one run. Every method is safe: failures are logged once and that observer dropped.

    Called from the driver's thread and the message pump's; one lock keeps the observers' calls in order and
    never overlapping (pending metrics go first, so an event comes after the metrics sent before it)."""

    def __init__(self, handles: list[tuple[str, Any]], run_id: str = "") -> None:
        self._handles = handles
        self.run_id = run_id
        self._lock = threading.RLock()
        self._pending: list[dict[str, Any]] = []
        self._delivered_at = time.monotonic()
        self.points_dropped = 0
        # Whether workers' messages should reach the driver for the observers (even without callbacks).
        self.takes_metrics = any(callable(getattr(handle, "metrics", None)) for _, handle in handles)

    @classmethod
    def start(cls, describe: Callable[[], dict[str, Any]], run_id: str | None = None) -> RunWatch:
        """Start watching the run ``describe()`` returns, under ``run_id`` (default: a new one), which observers
        record it by. ``describe`` is called only when someone observes (a call's hot path pays nothing
        without observers)."""
        run_id = run_id or uuid.uuid4().hex
        factories = _load_factories() if tracking_enabled() else []
        if not factories:
            return cls([], run_id)
        run = {**describe(), "id": run_id}
        handles: list[tuple[str, Any]] = []
        for factory in factories:
            name = getattr(factory, "__qualname__", repr(factory))
            try:
                handle = factory().start_run(run)
            except Exception as error:
                logger.warning("Run observer %s failed to start (%s); this run goes unobserved by it.", name, error)
                continue
            if handle is not None:
                handles.append((name, handle))
        return cls(handles, run_id)

    @property
    def observed(self) -> bool:
        return bool(self._handles)

    def listeners(self, callbacks: list[Callable[[dict[str, Any]], None]]) -> list[Callable[[dict[str, Any]], None]]:
        """The callbacks of a call, with this watch's own after them when observers take metrics."""
        return [*callbacks, self.message] if self.takes_metrics else callbacks

    def message(self, message: dict[str, Any]) -> None:
        """A message callback: keep the metrics in it for the next delivery. Never raises (a callback that
        raised would stop the call's message delivery)."""
        try:
            report = metric_report(message)
        except Exception as error:  # a Mapping whose items() fail: not ours to report
            logger.debug("A message could not be read for metrics: %s", error)
            return
        if report is None:
            return
        point = {"step": report[0], "values": report[1], "time_ms": int(time.time() * 1000)}
        with self._lock:
            self._pending.append(point)
            if len(self._pending) > MAX_PENDING_POINTS:
                del self._pending[0]
                if not self.points_dropped:
                    logger.warning(
                        "Workers sent more than %d metric reports within %s s; run tracking keeps the newest.",
                        MAX_PENDING_POINTS,
                        METRICS_INTERVAL_S,
                    )
                self.points_dropped += 1

    def tick(self) -> None:
        """Deliver pending metrics when the last delivery is METRICS_INTERVAL_S old (the pump calls it after
        every pull, at least twice a second)."""
        if self._pending and time.monotonic() - self._delivered_at >= METRICS_INTERVAL_S:
            with self._lock:
                self._flush()

    def workers_changed(self, workers: Sequence[dict[str, Any]], world_size: int, resets: int) -> None:
        with self._lock:
            self._flush()
            self._each("workers_changed", list(workers), world_size, resets)

    def event(self, kind: str, fields: dict[str, Any]) -> None:
        with self._lock:
            self._flush()
            self._each("event", kind, fields, optional=True)

    def worker_exited(self, worker: dict[str, Any], status: str, detail: str) -> None:
        self.event("worker_exited", {"worker": worker, "status": status, "detail": detail})

    def finished(self) -> None:
        with self._lock:
            self._flush()
            self._each("finished")

    def failed(self, detail: str) -> None:
        with self._lock:
            self._flush()
            self._each("failed", detail)

    def _flush(self) -> None:
        points, self._pending = self._pending, []
        self._delivered_at = time.monotonic()
        if points:
            self._each("metrics", points, optional=True)

    def _each(self, method: str, *args: Any, optional: bool = False) -> None:
        for entry in list(self._handles):
            name, handle = entry
            call = getattr(handle, method, None)
            if call is None and optional:
                continue
            try:
                call(*args)  # type: ignore[misc]  # a missing required method raises here, like any failure
            except Exception as error:
                logger.warning("Run observer %s failed in %s (%s); it stops observing this run.", name, method, error)
                self._handles.remove(entry)


def exception_line(trace: str) -> str:
    """The line of a traceback that names the exception (its last non-empty one), for an exit's detail."""
    lines = [line.strip() for line in trace.strip().splitlines() if line.strip()]
    return lines[-1][:1000] if lines else "its function raised"


def run_name(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__)


def run_record(
    name: str,
    controller: Any,
    workers: list[dict[str, Any]],
    world_size: int,
    min_workers: int | None = None,
    max_workers: int | None = None,
) -> dict[str, Any]:
    """What observers learn of a run. ``controller``: an actor that lives exactly as long as the run's executor
    (its message actor), so that a run whose controller is gone is known to be abandoned."""
    import ray

    return {
        "name": name,
        "job_id": ray.get_runtime_context().get_job_id(),
        "controller_actor_id": controller._actor_id.hex() if controller is not None else None,
        "workers": workers,
        "world_size": world_size,
        "min_workers": min_workers,
        "max_workers": max_workers,
    }


def worker_record(actor: Any, rank: int, local_rank: int, node_rank: int, node: Any) -> dict[str, Any]:
    """What observers get for one worker (``node`` is a NodeInfo)."""
    return {
        "actor_id": actor._actor_id.hex(),
        "world_rank": rank,
        "local_rank": local_rank,
        "node_rank": node_rank,
        "node_id": node.node_id,
        "node_ip": node.node_ip,
        "hostname": node.hostname,
        "pid": node.pid,
        "gpu_ids": list(node.gpu_ids),
    }
