"""The histories of every run the state actor holds, bounded in number.

A run still going keeps its history as objects (updated often); an ended run's is kept as its JSON document,
a fraction of the memory. At most ``max_histories`` runs keep one: beyond that, the histories of ended runs go,
those that started first first (the runs themselves stay, under the table's own retention); a run still going
never loses its history.
"""

from __future__ import annotations

import heapq
from typing import Any

import pydantic_core

from elastrain.state._private.history import RunHistory


class Histories:
    def __init__(self, max_histories: int) -> None:
        self.max_histories = max_histories
        self._live: dict[str, RunHistory] = {}
        self._ended: dict[str, str] = {}  # run id -> JSON document
        self._start: dict[str, int] = {}  # run id -> the run's start time, to drop the oldest first
        self._oldest: list[tuple[int, str]] = []  # a heap of (start, run id) of ended histories (some gone since)

    def __len__(self) -> int:
        return len(self._start)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._start

    def open(self, run_id: str, start_time_ms: int) -> tuple[RunHistory, list[str]]:
        """The run's history to change (a new one when it has none); and the runs whose histories were dropped to
        make room."""
        history = self._live.get(run_id)
        if history is not None:
            return history, []
        ended = self._ended.pop(run_id, None)
        history = RunHistory() if ended is None else RunHistory.from_json(ended)
        self._live[run_id] = history
        new = run_id not in self._start
        self._start[run_id] = start_time_ms
        return history, self._make_room(keep=run_id) if new else []

    def end(self, run_id: str) -> None:
        """The run ended: keep its history as JSON."""
        history = self._live.pop(run_id, None)
        if history is not None:
            self._ended[run_id] = history.json()
            self._push(run_id)

    def drop(self, run_id: str) -> bool:
        self._live.pop(run_id, None)
        self._ended.pop(run_id, None)
        return self._start.pop(run_id, None) is not None

    def copy(self, run_id: str) -> str | dict[str, Any] | None:
        """The run's history to write out later: an ended run's JSON, or a copy of a live one's document (cheap
        to take under the caller's lock; :func:`as_json` serializes it after)."""
        history = self._live.get(run_id)
        if history is None:
            return self._ended.get(run_id)
        document = history.document()
        metrics = document["metrics"]
        columns = {name: list(column) for name, column in metrics["values"].items()}
        copied = {**metrics, "steps": list(metrics["steps"]), "time_ms": list(metrics["time_ms"]), "values": columns}
        return {**document, "metrics": copied}

    def document(self, run_id: str) -> dict[str, Any] | None:
        """The run's history as a JSON-ready ``HistoryDocument`` (a live one's columns themselves: read them under
        the caller's lock, never change them)."""
        history = self._live.get(run_id)
        if history is not None:
            return history.document()
        text = self._ended.get(run_id)
        if text is None:
            return None
        document: dict[str, Any] = pydantic_core.from_json(text)
        return document

    def restore(self, run_id: str, history: RunHistory, start_time_ms: int, ended: bool) -> list[str]:
        """Take a loaded history, with what was recorded for its run since the actor restarted added to it; the
        runs whose histories were dropped to make room."""
        since = self._live.get(run_id)
        if since is None and run_id in self._ended:
            since = RunHistory.from_json(self._ended[run_id])
        if since is not None:
            history.absorb(since)
        self.drop(run_id)
        self._start[run_id] = start_time_ms
        if ended:
            self._ended[run_id] = history.json()
            self._push(run_id)
        else:
            self._live[run_id] = history
        return self._make_room(keep=run_id)

    def _push(self, run_id: str) -> None:
        if len(self._oldest) > 2 * len(self._ended) + 64:  # mostly entries of histories gone since: rebuild
            self._oldest = [(self._start[ended], ended) for ended in self._ended]
            heapq.heapify(self._oldest)
        heapq.heappush(self._oldest, (self._start[run_id], run_id))

    def _make_room(self, keep: str) -> list[str]:
        dropped = []
        while len(self._start) > self.max_histories and self._oldest:
            _, run_id = heapq.heappop(self._oldest)
            if run_id in self._ended and run_id != keep:  # else reopened or dropped since it was pushed
                self.drop(run_id)
                dropped.append(run_id)
        return dropped


def as_json(history: str | dict[str, Any]) -> str:
    return history if isinstance(history, str) else pydantic_core.to_json(history).decode()
