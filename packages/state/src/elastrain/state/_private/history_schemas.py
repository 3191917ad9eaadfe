"""The schemas of a run's history: metric points, events and departed workers, as stored and as served.

Everything here is bounded, so that a run reporting for weeks costs the same memory and snapshot bytes as one
reporting for minutes: at most MAX_HISTORY_POINTS metric points (fewer with many metrics: MAX_HISTORY_VALUES in
all), MAX_EVENTS events and MAX_DEPARTED departed workers per run.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any

from pydantic import AfterValidator, Field, model_validator

from elastrain.state._private.schemas import (
    MAX_METRICS,
    Id,
    Name,
    NonNegative,
    RunStatus,
    TrainWorkerInfo,
    _Frozen,
    truncate_detail,
)

# A run's metric history keeps at most this many points, and at most this many values (points × metrics), so
# that 32 metrics keep 512 points. Old points are thinned out (every other one dropped) to stay within both.
MAX_HISTORY_POINTS = 1000
MAX_HISTORY_VALUES = 16_384
# A run keeps its newest events and departed workers, this many of each.
MAX_EVENTS = 1000
MAX_DEPARTED = 256
# An event's or a departed worker's detail (why it happened) keeps this many characters, head and tail.
EVENT_DETAIL_MAX_CHARS = 1024
# Steps are non-negative 64-bit integers (what a chart's JSON reader and every tensor library hold exactly).
MAX_STEP = 2**63 - 1
# The most points or events one page of the API holds: a whole metric history fits in one.
MAX_HISTORY_PAGE = 1000

Step = Annotated[int, Field(ge=0, le=MAX_STEP)]


def _detail(detail: str | None) -> str | None:
    return None if detail is None else truncate_detail(detail, EVENT_DETAIL_MAX_CHARS)


Detail = Annotated[str | None, AfterValidator(_detail)]


class RunEventKind(enum.StrEnum):
    WORLD_SIZE = "WORLD_SIZE"  # the world size changed (the first world too: from 0)
    RESET = "RESET"  # a new world replaced the previous one (resets went up)
    WORKER_EXITED = "WORKER_EXITED"  # a worker left while the run went on: CRASHED or REMOVED
    RUN_ENDED = "RUN_ENDED"  # the run ended (FINISHED, ERRORED or ABORTED); its workers with it


class RunEvent(_Frozen):
    """Something that happened to a run. ``step`` is the step of the newest metrics reported before it (None
    when none were); ``world_size`` and ``resets`` are the run's after it. ``status``: for WORKER_EXITED the
    worker's (CRASHED, REMOVED), for RUN_ENDED the run's. ``worker``: the worker that exited."""

    seq: NonNegative
    kind: RunEventKind
    time_ms: NonNegative
    step: Step | None = None
    world_size: NonNegative = 0
    resets: NonNegative = 0
    status: Annotated[str, Field(max_length=16)] | None = None
    worker: TrainWorkerInfo | None = None
    detail: Detail = None


class DepartedWorker(TrainWorkerInfo):
    """A worker that left a run still going, with how (``status``: CRASHED or REMOVED), when, and why."""

    left_time_ms: NonNegative
    left_step: Step | None = None
    detail: Detail = None


class StoredMetrics(_Frozen):
    """A run's metric history, by column: ``values[name][i]`` is metric ``name`` at ``steps[i]`` (None when that
    step did not report it, or reported NaN or an infinity). The kept points are the first report and every
    ``stride``-th one after it, plus the newest."""

    steps: list[Step] = Field(default_factory=list)
    time_ms: list[NonNegative] = Field(default_factory=list)
    values: dict[Name, list[float | None]] = Field(default_factory=dict)
    stride: Annotated[int, Field(ge=1)] = 1
    steps_reported: NonNegative = 0
    last_step: Step | None = None
    left_out: NonNegative = 0

    @model_validator(mode="after")
    def _consistent(self) -> StoredMetrics:
        points = len(self.steps)
        if points > MAX_HISTORY_POINTS or points * max(len(self.values), 1) > MAX_HISTORY_VALUES:
            raise ValueError(
                f"a metric history holds at most {MAX_HISTORY_POINTS} points and {MAX_HISTORY_VALUES} values"
            )
        if len(self.values) > MAX_METRICS:
            raise ValueError(f"a metric history holds at most {MAX_METRICS} metrics")
        if len(self.time_ms) != points or any(len(column) != points for column in self.values.values()):
            raise ValueError("every column of a metric history has one entry per step")
        if any(later <= earlier for earlier, later in zip(self.steps, self.steps[1:], strict=False)):
            raise ValueError("the steps of a metric history increase")
        return self


class HistoryDocument(_Frozen):
    """A run's whole history as snapshots store it (beside the run, under ``"history"``)."""

    metrics: StoredMetrics = Field(default_factory=StoredMetrics)
    events: tuple[RunEvent, ...] = Field(default=(), max_length=MAX_EVENTS)
    next_event_seq: NonNegative = 0
    departed: tuple[DepartedWorker, ...] = Field(default=(), max_length=MAX_DEPARTED)
    departed_dropped: NonNegative = 0


# -- what the API serves -------------------------------------------------------------------------------------


class MetricHistory(_Frozen):
    """A page of a run's metric history, by column (see ``StoredMetrics``); ``names``: every metric the history
    holds, ``values``: those asked for. ``next_after_step``: pass it as ``after_step`` for the next page (None:
    no more). ``retained`` is False when the run's history was dropped (only the newest runs keep one)."""

    run_id: Id
    names: list[Name]
    steps: list[Step]
    time_ms: list[NonNegative]
    values: dict[Name, list[float | None]]
    stride: Annotated[int, Field(ge=1)]
    steps_reported: NonNegative
    retained: bool
    next_after_step: Step | None


class RunEvents(_Frozen):
    """A page of a run's events, oldest first. ``dropped``: older events no longer kept. ``next_after_seq``: pass
    it as ``after_seq`` for the next page (None: no more)."""

    run_id: Id
    events: list[RunEvent]
    dropped: NonNegative
    retained: bool
    next_after_seq: NonNegative | None


class RunWorkers(_Frozen):
    """A run's workers now (by rank) and those that left it, oldest first (``departed_dropped``: older ones no
    longer kept)."""

    run_id: Id
    run_status: RunStatus
    workers: list[TrainWorkerInfo]
    departed: list[DepartedWorker]
    departed_dropped: NonNegative
    retained: bool


def empty_document() -> dict[str, Any]:
    return HistoryDocument().model_dump(mode="json")
