"""One run's history: its metrics downsampled to a bounded number of points, its events, its departed workers.

Metrics are kept per step: a report of a step the history holds updates that point (several workers reporting
one step make one point; a step reported again after a rollback replaces its values), and a report of a newer
step adds a point. When the points outgrow their bound, every other one is dropped and from then on only every
``stride``-th new step is kept (the stride doubles each time), plus always the newest: a run of 100,000 steps
keeps the first step, every 128th after it and the last: 783 points spread evenly over the whole run. A report
of an older step that is no longer kept changes nothing (the run's latest metrics still show it).

Kept points are exactly the steps reported as the 0th, ``stride``-th, 2×``stride``-th... new step, and the
newest: point ``i`` (but the newest) is the ``i × stride``-th. Nothing else needs storing to go on thinning
after a snapshot is loaded.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Iterable, Mapping
from typing import Any

import pydantic_core

from elastrain.state._private.history_schemas import (
    MAX_DEPARTED,
    MAX_EVENTS,
    MAX_HISTORY_POINTS,
    MAX_HISTORY_VALUES,
    MAX_STEP,
    DepartedWorker,
    HistoryDocument,
    RunEvent,
    RunEventKind,
    StoredMetrics,
)
from elastrain.state._private.schemas import MAX_METRICS, TrainWorkerInfo

_EMPTY_METRICS = StoredMetrics()
_EMPTY = HistoryDocument()  # immutable: every new history starts from it without validating anything


class MetricSeries:
    """A run's metric points by column: ``steps``, ``time_ms`` and one list of values per metric."""

    def __init__(self, stored: StoredMetrics | None = None) -> None:
        stored = stored or _EMPTY_METRICS
        self.steps = list(stored.steps)
        self.time_ms = list(stored.time_ms)
        self.values = {name: list(column) for name, column in stored.values.items()}
        self.stride = stored.stride
        self.steps_reported = stored.steps_reported  # new steps reported: the next one is the n-th
        self.last_step = stored.last_step  # the step of the newest report (events are placed at it)
        self.left_out = stored.left_out  # values of metrics beyond MAX_METRICS names, not kept

    def report(self, step: int | None, values: Mapping[str, float | None], time_ms: int) -> int:
        """Record one report and return its step: without one, the step after the previous report's (0 first)."""
        if step is None:
            step = 0 if self.last_step is None else min(self.last_step + 1, MAX_STEP)
        self.last_step = step
        kept = self._admit(values)
        if self.steps and step <= self.steps[-1]:
            index = bisect.bisect_left(self.steps, step)
            if self.steps[index] == step:  # kept: update it; otherwise thinned out long ago, nothing to update
                for name, value in kept.items():
                    self.values[name][index] = value
            return step
        if self.steps and (self.steps_reported - 1) % self.stride:
            self._pop()  # the newest point was kept only as the newest: the new one takes its place
        self.steps.append(step)
        self.time_ms.append(time_ms)
        for name, column in self.values.items():
            column.append(kept.get(name))
        self.steps_reported += 1
        while len(self.steps) > self.capacity:
            self._thin()
        return step

    @property
    def capacity(self) -> int:
        return min(MAX_HISTORY_POINTS, MAX_HISTORY_VALUES // max(len(self.values), 1))

    def document(self) -> dict[str, Any]:
        """JSON-ready, as ``StoredMetrics`` (the columns themselves, not copies: read them under the same lock)."""
        return {
            "steps": self.steps,
            "time_ms": self.time_ms,
            "values": self.values,
            "stride": self.stride,
            "steps_reported": self.steps_reported,
            "last_step": self.last_step,
            "left_out": self.left_out,
        }

    def _admit(self, values: Mapping[str, float | None]) -> dict[str, float | None]:
        kept = {}
        for name, value in values.items():
            if name not in self.values:
                if len(self.values) >= MAX_METRICS:
                    self.left_out += 1
                    continue
                self.values[name] = [None] * len(self.steps)
            kept[name] = value
        return kept

    def _pop(self) -> None:
        self.steps.pop()
        self.time_ms.pop()
        for column in self.values.values():
            column.pop()

    def _thin(self) -> None:
        """Drop every other point, keeping the newest: points ``0, 2, 4...`` are the ``2 × stride``-th steps."""
        keep = [*range(0, len(self.steps) - 1, 2), len(self.steps) - 1]
        self.steps = [self.steps[i] for i in keep]
        self.time_ms = [self.time_ms[i] for i in keep]
        self.values = {name: [column[i] for i in keep] for name, column in self.values.items()}
        self.stride *= 2


def metrics_page(
    stored: Mapping[str, Any], names: Iterable[str] | None, after_step: int | None, limit: int
) -> dict[str, Any]:
    """Points after ``after_step`` (all: None), at most ``limit``, of the metrics ``names`` (all: None) of a
    ``StoredMetrics`` document; the fields of ``MetricHistory`` but ``run_id`` and ``retained``."""
    steps: list[int] = stored["steps"]
    start = 0 if after_step is None else bisect.bisect_right(steps, after_step)
    end = min(start + limit, len(steps))
    columns: dict[str, list[Any]] = stored["values"]
    wanted = list(columns) if names is None else [name for name in dict.fromkeys(names) if name in columns]
    return {
        "names": sorted(columns),
        "steps": steps[start:end],
        "time_ms": stored["time_ms"][start:end],
        "values": {name: columns[name][start:end] for name in wanted},
        "stride": stored["stride"],
        "steps_reported": stored["steps_reported"],
        "next_after_step": steps[end - 1] if end < len(steps) else None,
    }


class RunHistory:
    """A run's metric series, its newest MAX_EVENTS events and its newest MAX_DEPARTED departed workers."""

    def __init__(self, document: HistoryDocument | None = None) -> None:
        document = document or _EMPTY
        self.metrics = MetricSeries(document.metrics)
        self.events: collections.deque[dict[str, Any]] = collections.deque(
            (event.model_dump(mode="json") for event in document.events), maxlen=MAX_EVENTS
        )
        self.next_event_seq = document.next_event_seq
        self.departed: collections.deque[dict[str, Any]] = collections.deque(
            (worker.model_dump(mode="json") for worker in document.departed), maxlen=MAX_DEPARTED
        )
        self.departed_dropped = document.departed_dropped

    @classmethod
    def from_json(cls, text: str) -> RunHistory:
        return cls(HistoryDocument.model_validate_json(text))

    def document(self) -> dict[str, Any]:
        return {
            "metrics": self.metrics.document(),
            "events": list(self.events),
            "next_event_seq": self.next_event_seq,
            "departed": list(self.departed),
            "departed_dropped": self.departed_dropped,
        }

    def json(self) -> str:
        return pydantic_core.to_json(self.document()).decode()

    def event(
        self,
        kind: RunEventKind,
        time_ms: int,
        *,
        world_size: int,
        resets: int,
        status: str | None = None,
        worker: Mapping[str, Any] | None = None,
        detail: str | None = None,
    ) -> None:
        event = RunEvent(
            seq=self.next_event_seq,
            kind=kind,
            time_ms=time_ms,
            step=self.metrics.last_step,
            world_size=world_size,
            resets=resets,
            status=status,
            worker=None if worker is None else TrainWorkerInfo.model_validate(worker),
            detail=detail,
        )
        self.events.append(event.model_dump(mode="json"))
        self.next_event_seq += 1

    def absorb(self, newer: RunHistory) -> None:
        """Add what ``newer`` recorded (the same run's history, begun when the state actor restarted before this
        one was loaded): its metric points, events and departed workers, in order."""
        metrics = newer.metrics
        for index, step in enumerate(metrics.steps):
            values = {name: column[index] for name, column in metrics.values.items() if column[index] is not None}
            self.metrics.report(step, values, metrics.time_ms[index])
        for event in newer.events:
            self.events.append({**event, "seq": self.next_event_seq})
            self.next_event_seq += 1
        for worker in newer.departed:
            if not self.has_departed(worker["actor_id"]):
                if len(self.departed) == MAX_DEPARTED:
                    self.departed_dropped += 1
                self.departed.append(worker)

    def has_departed(self, actor_id: str) -> bool:
        return any(worker["actor_id"] == actor_id for worker in self.departed)

    def depart(self, worker: Mapping[str, Any], status: str, time_ms: int, detail: str | None) -> None:
        """Record a worker that left (once: a later report of the same worker changes nothing)."""
        if self.has_departed(str(worker["actor_id"])):
            return
        record = DepartedWorker.model_validate(
            {**worker, "status": status, "left_time_ms": time_ms, "left_step": self.metrics.last_step, "detail": detail}
        )
        if len(self.departed) == MAX_DEPARTED:
            self.departed_dropped += 1
        self.departed.append(record.model_dump(mode="json"))


def events_page(document: Mapping[str, Any], after_seq: int | None, limit: int) -> dict[str, Any]:
    """Events after ``after_seq`` (all: None), at most ``limit``, of a ``HistoryDocument``; the fields of
    ``RunEvents`` but ``run_id`` and ``retained``."""
    events: list[dict[str, Any]] = document["events"]
    start = 0 if after_seq is None else bisect.bisect_right([event["seq"] for event in events], after_seq)
    page = events[start : start + limit]
    more = start + limit < len(events)
    return {
        "events": page,
        "dropped": document["next_event_seq"] - len(events),
        "next_after_seq": page[-1]["seq"] if more and page else None,
    }
