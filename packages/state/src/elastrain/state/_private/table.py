"""The runs the state actor holds: indexed so that a page costs what the page holds, not what the table holds.

Runs are ordered newest first by (start time, id). Every filter (status, job id, name) has its own sorted
index, so a filtered page starts at the cursor with a binary search and reads only runs that match.
"""

from __future__ import annotations

import base64
import bisect
from collections.abc import Iterable
from typing import Any

from elastrain.state._private.schemas import RunStatus, TrainRunInfo

_Key = tuple[int, str]  # (-start_time_ms, id): ascending order is newest first
MAX_PAGE = 1000


class RunTable:
    def __init__(self, max_runs: int) -> None:
        if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1:
            raise ValueError(f"max_runs must be a positive int, got {max_runs!r}.")
        self.max_runs = max_runs
        self._runs: dict[str, TrainRunInfo] = {}
        self._order: list[_Key] = []
        self._indexes: dict[tuple[str, str], list[_Key]] = {}  # ("status"|"job_id"|"name", value) -> keys

    def __len__(self) -> int:
        return len(self._runs)

    def get(self, run_id: str) -> TrainRunInfo | None:
        return self._runs.get(run_id)

    def count_by_status(self) -> dict[str, int]:
        """Runs per status, from the indexes (no scan)."""
        return {status.value: len(self._indexes.get(("status", status.value), [])) for status in RunStatus}

    def all(self) -> list[TrainRunInfo]:
        return [self._runs[key[1]] for key in self._order]

    def put(self, run: TrainRunInfo) -> TrainRunInfo:
        """Store ``run`` (replacing the run with its id); then drop the oldest finished runs beyond max_runs."""
        old = self._runs.get(run.id)
        if old is not None:
            self._unindex(old)
        self._runs[run.id] = run
        self._index(run)
        self._evict()
        return run

    def page(
        self,
        *,
        status: RunStatus | None = None,
        job_id: str | None = None,
        name: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> tuple[list[TrainRunInfo], str | None]:
        """Runs newest first that match every given filter, after ``cursor``; and the cursor of the next page."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit must be an int from 1 to {MAX_PAGE}, got {limit!r}.")
        filters = [("status", status.value)] if status is not None else []
        filters += [("job_id", job_id)] if job_id is not None else []
        filters += [("name", name)] if name is not None else []
        candidates = [self._indexes.get(f, []) for f in filters] or [self._order]
        keys = min(candidates, key=len)
        start = bisect.bisect_right(keys, decode_cursor(cursor)) if cursor else 0
        found: list[TrainRunInfo] = []
        position = start
        while position < len(keys) and len(found) < limit:
            run = self._runs[keys[position][1]]
            if all(_value(run, field) == value for field, value in filters):
                found.append(run)
            position += 1
        # A full page with runs left to read has a next page (which may turn out empty when none of them match).
        next_cursor = encode_cursor(_key(found[-1])) if len(found) == limit and position < len(keys) else None
        return found, next_cursor

    def _evict(self) -> None:
        excess = len(self._runs) - self.max_runs
        if excess <= 0:
            return
        # Oldest first; runs that are still going are never dropped.
        for key in reversed(self._order[:]):
            if excess <= 0:
                break
            run = self._runs[key[1]]
            if run.run_status.is_terminal:
                self._unindex(run)
                del self._runs[run.id]
                excess -= 1

    def _index(self, run: TrainRunInfo) -> None:
        key = _key(run)
        bisect.insort(self._order, key)
        for index in _index_names(run):
            bisect.insort(self._indexes.setdefault(index, []), key)

    def _unindex(self, run: TrainRunInfo) -> None:
        key = _key(run)
        _remove(self._order, key)
        for index in _index_names(run):
            keys = self._indexes.get(index)
            if keys is not None:
                _remove(keys, key)
                if not keys:
                    del self._indexes[index]


def _key(run: TrainRunInfo) -> _Key:
    return (-run.start_time_ms, run.id)


def _index_names(run: TrainRunInfo) -> Iterable[tuple[str, str]]:
    return (("status", run.run_status.value), ("job_id", run.job_id), ("name", run.name))


def _value(run: TrainRunInfo, field: str) -> Any:
    return run.run_status.value if field == "status" else getattr(run, field)


def _remove(keys: list[_Key], key: _Key) -> None:
    position = bisect.bisect_left(keys, key)
    if position < len(keys) and keys[position] == key:
        del keys[position]


def encode_cursor(key: _Key) -> str:
    return base64.urlsafe_b64encode(f"{-key[0]}:{key[1]}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> _Key:
    """The position a cursor stands for; a cursor this table did not make raises ValueError."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        start, run_id = text.split(":", 1)
        return (-int(start), run_id)
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"cursor {cursor!r} is not one this API returned: {error}") from None
