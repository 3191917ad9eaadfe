"""Run observers: packages such as elastrain-state watch the executor's runs through an entry point.

A run's record carries its ``id``: the executor's ``last_run_id``, which trackers should record it by.
A package registers a factory in the ``elastrain.executor.observers`` entry-point group. The factory (called
with no arguments) returns an observer whose ``start_run(run)`` returns a handle with ``workers_changed(workers,
world_size, resets)``, ``finished()`` and ``failed(detail)``. Everything passed is plain dicts and strings, so
the executor imports nothing of the observer's. An observer that raises is dropped with one warning: watching a
job must never fail it. ``ELASTRAIN_TRACKING=0`` turns observers off.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger("elastrain.executor")

ENTRY_POINT_GROUP = "elastrain.executor.observers"
TRACKING_ENV = "ELASTRAIN_TRACKING"
_OFF = {"0", "false", "no", "off"}

_factories: list[Any] | None = None  # loaded once per process


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
    """The observers of one run. Every method is safe: failures are logged once and that observer dropped."""

    def __init__(self, handles: list[tuple[str, Any]], run_id: str = "") -> None:
        self._handles = handles
        self.run_id = run_id

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

    def workers_changed(self, workers: Sequence[dict[str, Any]], world_size: int, resets: int) -> None:
        self._each("workers_changed", list(workers), world_size, resets)

    def finished(self) -> None:
        self._each("finished")

    def failed(self, detail: str) -> None:
        self._each("failed", detail)

    def _each(self, method: str, *args: Any) -> None:
        for entry in list(self._handles):
            name, handle = entry
            try:
                getattr(handle, method)(*args)
            except Exception as error:
                logger.warning("Run observer %s failed in %s (%s); it stops observing this run.", name, method, error)
                self._handles.remove(entry)


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
