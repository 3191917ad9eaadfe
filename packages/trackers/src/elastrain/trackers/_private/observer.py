"""The executor's run observer (entry point ``elastrain.executor.observers``): each run goes to the trackers in use.

Which trackers: those given to :func:`use` in the driver's process, else those ``ELASTRAIN_TRACKERS`` names
(``mlflow``, ``tensorboard``, ``wandb``, comma-separated), each set up from its environment variables. Neither
set: the observer records nothing, and nothing of any tracker is imported.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from elastrain.trackers._private.background import Background
from elastrain.trackers._private.tracker import Event, Point, RunInfo, RunRecorder, Tracker

logger = logging.getLogger("elastrain.trackers")

TRACKERS_ENV = "ELASTRAIN_TRACKERS"
CLOSE_ENV = "ELASTRAIN_TRACKERS_CLOSE_S"
# How long the end of a run waits for a tracker to take what is queued for it.
DEFAULT_CLOSE_S = 10.0

_in_use: list[Tracker] | None = None
_lock = threading.Lock()


def use(*trackers: Tracker) -> None:
    """Record the runs this process starts from now on in ``trackers`` (none: in none, whatever
    ``ELASTRAIN_TRACKERS`` says)."""
    global _in_use
    with _lock:
        _in_use = list(trackers)


def trackers_in_use() -> list[Tracker]:
    """What :func:`use` set, else what ``ELASTRAIN_TRACKERS`` names."""
    with _lock:
        if _in_use is not None:
            return list(_in_use)
    return from_environment()


def from_environment() -> list[Tracker]:
    from elastrain.trackers._private.mlflow_tracker import MLflowTracker
    from elastrain.trackers._private.tensorboard_tracker import TensorBoardTracker
    from elastrain.trackers._private.wandb_tracker import WandbTracker

    known: dict[str, type[Any]] = {"mlflow": MLflowTracker, "tensorboard": TensorBoardTracker, "wandb": WandbTracker}
    names = [n.strip().lower() for n in os.environ.get(TRACKERS_ENV, "").split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(
            f"{TRACKERS_ENV}={os.environ[TRACKERS_ENV]!r} names {', '.join(unknown)}; it takes a comma-separated "
            f"list of {', '.join(known)}."
        )
    return [known[name]() for name in dict.fromkeys(names)]


def _close_s() -> float:
    try:
        return max(float(os.environ.get(CLOSE_ENV, DEFAULT_CLOSE_S)), 0.0)
    except ValueError:
        return DEFAULT_CLOSE_S


class TrackersObserver:
    """The entry point: called with no arguments by the executor, once per process."""

    def start_run(self, run: Mapping[str, Any]) -> RunFanout | None:
        trackers = trackers_in_use()
        if not trackers:
            return None
        return RunFanout(trackers, RunInfo.of(run))


class RunFanout:
    """One run's calls from the executor, turned into tracker calls on each tracker's own thread."""

    def __init__(self, trackers: Sequence[Tracker], run: RunInfo) -> None:
        self.run = run
        self._lanes: list[tuple[Background, _Lazy]] = []
        for tracker in trackers:
            lane = Background(tracker.name)
            recorder = _Lazy(tracker, run)
            lane.submit(recorder.open)
            self._lanes.append((lane, recorder))
        self._step: int | None = None  # the newest step reported: where resets and exits are drawn
        self._resets = 0
        self._world_size = run.world_size
        self._each("world_size", run.world_size, 0, None, _now_ms())

    # -- the executor's observer calls ---------------------------------------------------------------------------

    def metrics(self, points: list[dict[str, Any]]) -> None:
        batch = [p for p in map(_point, points) if p is not None]
        for point in batch:
            if point.step is not None:
                self._step = point.step if self._step is None else max(self._step, point.step)
        if batch:
            self._each("metrics", batch)

    def workers_changed(self, workers: list[dict[str, Any]], world_size: int, resets: int) -> None:
        now = _now_ms()
        if resets > self._resets:
            text = f"reset {resets}: a new group of {world_size} workers"
            fields = {"world_size": world_size, "resets": resets, "previous_world_size": self._world_size}
            self._each("event", Event("reset", text, self._step, now, fields))
        if world_size != self._world_size or resets != self._resets:
            self._each("world_size", world_size, resets, self._step, now)
        self._world_size, self._resets = world_size, max(resets, self._resets)

    def event(self, kind: str, fields: dict[str, Any]) -> None:
        if kind == "worker_exited":
            worker = fields.get("worker") or {}
            text = (
                f"worker {worker.get('world_rank')} on {worker.get('hostname') or worker.get('node_ip')} "
                f"{str(fields.get('status', 'exited')).lower()}: {fields.get('detail') or ''}".rstrip(": ")
            )
            self._each("event", Event(kind, text, self._step, _now_ms(), dict(fields)))

    def finished(self) -> None:
        self._end("FINISHED", None)

    def failed(self, detail: str) -> None:
        self._end("FAILED", detail)

    # ------------------------------------------------------------------------------------------------------------

    def _end(self, status: str, detail: str | None) -> None:
        self._each("end", status, detail)
        until = time.monotonic() + _close_s()  # one deadline for all: they drain at once, each on its thread
        for lane, _ in self._lanes:
            lane.close(until)

    def _each(self, method: str, *args: Any) -> None:
        for lane, recorder in self._lanes:
            lane.submit(recorder.call, method, *args)


class _Lazy:
    """A tracker's recorder for one run, opened on the tracker's own thread (opening may block on a server)."""

    def __init__(self, tracker: Tracker, run: RunInfo) -> None:
        self._tracker, self._run = tracker, run
        self._recorder: RunRecorder | None = None

    def open(self) -> None:
        self._recorder = self._tracker.open(self._run)

    def call(self, method: str, *args: Any) -> None:
        if self._recorder is not None:  # it failed to open: that was said once
            getattr(self._recorder, method)(*args)


def _point(point: Mapping[str, Any]) -> Point | None:
    step = point.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        step = None
    values = {
        str(name): float(value)
        for name, value in (point.get("values") or {}).items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }
    if not values:
        return None
    time_ms = point.get("time_ms")
    return Point(step, values, time_ms if isinstance(time_ms, int) else _now_ms())


def _now_ms() -> int:
    return int(time.time() * 1000)
