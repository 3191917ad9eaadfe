"""What a tracker implements: a factory of per-run recorders, each called on its own background thread."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class RunInfo:
    """A run as trackers see it when it starts."""

    id: str  # the executor's run id (``RayExecutor.last_run_id``)
    name: str
    job_id: str | None
    world_size: int
    min_workers: int | None
    max_workers: int | None
    params: Mapping[str, Any] = field(default_factory=dict)  # what a tracker logs as the run's parameters

    @classmethod
    def of(cls, run: Mapping[str, Any]) -> RunInfo:
        params = {
            "world_size": run.get("world_size"),
            "min_workers": run.get("min_workers"),
            "max_workers": run.get("max_workers"),
            **dict(run.get("settings") or {}),
        }
        return cls(
            id=str(run.get("id") or ""),
            name=str(run.get("name") or "run"),
            job_id=run.get("job_id"),
            world_size=int(run.get("world_size") or 0),
            min_workers=run.get("min_workers"),
            max_workers=run.get("max_workers"),
            params={k: v for k, v in params.items() if v is not None},
        )


@dataclass(frozen=True)
class Point:
    """Numbers one worker sent at one step (``step`` None when it sent none)."""

    step: int | None
    values: Mapping[str, float]
    time_ms: int


@dataclass(frozen=True)
class Event:
    """Something that happened to the run, for the tracker's events, tags or text.

    ``kind``: ``"reset"`` (a new group formed: ``fields`` has ``world_size`` and ``resets``), ``"worker_exited"``
    (``worker``, ``status``: CRASHED or REMOVED, ``detail``), or a kind a later version adds.
    """

    kind: str
    text: str  # one line for people
    step: int | None  # the newest step reported before it
    time_ms: int
    fields: Mapping[str, Any] = field(default_factory=dict)


class RunRecorder(Protocol):
    """One run in one tracker. Its calls come in order, on one thread, never at once."""

    def metrics(self, points: Sequence[Point]) -> None: ...
    def world_size(self, size: int, resets: int, step: int | None, time_ms: int) -> None: ...
    def event(self, event: Event) -> None: ...
    def end(self, status: str, detail: str | None) -> None:
        """``status``: FINISHED or FAILED (``detail`` says why)."""


class Tracker(Protocol):
    """A place runs are recorded: ``open`` is called on the tracker's own thread as a run starts."""

    name: str

    def open(self, run: RunInfo) -> RunRecorder: ...
