"""The snapshot layout: a base file holding every run, then journal segments holding the runs that changed.

```
base-0000000007.json                 {"format": "elastrain-state", "kind": "base", "generation": 7,
                                      "cluster_id": "41c0...", "runs": [...]}
journal-0000000007-00000001.json     {"kind": "journal", "generation": 7, "seq": 1, "runs": [...], "removed": [...]}
journal-0000000007-00000002.json     ...
```

Loading reads the base of the highest generation and applies its segments in order (a later document of a run
replaces an earlier one; ``removed`` drops runs that retention evicted). Since schema version 2 a run's document
may hold its history under ``"history"`` (a ``HistoryDocument``); version 1 files load as runs without one.
``cluster_id`` names the Ray cluster whose state actor wrote the base (its segments are always written by the
same actor). Compaction writes the next generation's base, then deletes every file of older generations: a
crash in between leaves both, and the newer one is read. File names are never reused, so an old write that
lands late cannot overwrite a newer file.

A file that cannot be read (not JSON, not this format, or written by a newer elastrain-state) is moved into a
``set-aside-<time>/`` folder beside the others, with the segments of its generation when it is a base; an
older base, if a crashed compaction left one, is read instead, and otherwise the actor starts without them.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from elastrain.state._private.history import RunHistory
from elastrain.state._private.history_schemas import HistoryDocument
from elastrain.state._private.schemas import SCHEMA_VERSION, TrainRunInfo, migrate
from elastrain.state._private.store import TEMPORARY_SUFFIX, Store

logger = logging.getLogger("elastrain.state")

FORMAT = "elastrain-state"
_BASE = re.compile(r"^base-(\d{10})\.json$")
_SEGMENT = re.compile(r"^journal-(\d{10})-(\d{8})\.json$")
SET_ASIDE_PREFIX = "set-aside-"


def base_name(generation: int) -> str:
    return f"base-{generation:010d}.json"


def segment_name(generation: int, seq: int) -> str:
    return f"journal-{generation:010d}-{seq:08d}.json"


class Unreadable(Exception):
    """A snapshot file that is corrupt, not ours, or newer than this package."""


@dataclass
class Loaded:
    runs: dict[str, TrainRunInfo] = field(default_factory=dict)
    histories: dict[str, RunHistory] = field(default_factory=dict)  # by run id, for the runs that have one
    generation: int = 0
    next_seq: int = 1
    base_bytes: int = 0
    journal_bytes: int = 0
    segments: int = 0
    cluster_id: str | None = None  # the Ray cluster that wrote them
    problems: list[str] = field(default_factory=list)  # what was set aside or dropped, for info() and the log


class Snapshots:
    """Reads and writes the layout above in one :class:`Store`."""

    def __init__(self, store: Store, cluster_id: str | None = None) -> None:
        self.store = store
        self.cluster_id = cluster_id

    def load(self) -> Loaded:
        """The runs the folder holds. Raises only when the store itself fails (the caller tries again later)."""
        names = self.store.names()
        for name in names:
            if name.endswith(TEMPORARY_SUFFIX):  # left by a process that died mid-write
                self.store.delete(name)
        bases = sorted((int(m.group(1)), name) for name in names if (m := _BASE.match(name)))
        loaded = Loaded()
        if not bases:
            return loaded
        loaded.generation = bases[-1][0]  # the next base is newer than every file seen, even one set aside
        # The newest base that reads; one that does not is set aside with its segments, and the one before
        # (left by a compaction that crashed before deleting it) is tried.
        for generation, name in reversed(bases):
            segments = sorted(
                (int(m.group(2)), segment)
                for segment in names
                if (m := _SEGMENT.match(segment)) and int(m.group(1)) == generation
            )
            try:
                data = self.store.read(name)
                base = _decode(data, "base", name)
                break
            except Unreadable as problem:
                self._set_aside([name, *(segment for _, segment in segments)], str(problem), loaded)
        else:
            return loaded
        loaded.next_seq = (segments[-1][0] + 1) if segments else 1
        loaded.base_bytes = len(data)
        loaded.cluster_id = base.get("cluster_id") if isinstance(base.get("cluster_id"), str) else None
        self._apply(base["runs"], [], loaded)
        for _, segment in segments:
            data = self.store.read(segment)
            try:
                document = _decode(data, "journal", segment)
            except Unreadable as problem:
                self._set_aside([segment], str(problem), loaded)
                continue
            loaded.journal_bytes += len(data)
            loaded.segments += 1
            self._apply(document["runs"], document.get("removed", []), loaded)
        return loaded

    def write_base(self, generation: int, documents: list[str]) -> int:
        """Write every run as generation ``generation``'s base, then delete older generations; the bytes written."""
        data = _encode({"kind": "base", "generation": generation, "cluster_id": self.cluster_id}, documents)
        self.store.write(base_name(generation), data)
        for name in self.store.names():
            match = _BASE.match(name) or _SEGMENT.match(name)
            if match and int(match.group(1)) < generation:
                self.store.delete(name)
        return len(data)

    def write_segment(self, generation: int, seq: int, documents: list[str], removed: list[str]) -> int:
        header = {"kind": "journal", "generation": generation, "seq": seq, "cluster_id": self.cluster_id}
        data = _encode({**header, "removed": removed}, documents)
        self.store.write(segment_name(generation, seq), data)
        return len(data)

    def _apply(self, runs: list[Any], removed: list[Any], loaded: Loaded) -> None:
        dropped: list[str] = []
        histories_dropped: list[str] = []
        for document in runs:
            # Since schema version 2 a run may carry its history; a later document without one means it has none.
            history = document.pop("history", None) if isinstance(document, dict) else None
            try:
                run = TrainRunInfo.model_validate(migrate(document))
            except (ValueError, TypeError) as error:  # one bad run is dropped, not the whole snapshot
                dropped.append(str(error).splitlines()[0])
                continue
            loaded.runs[run.id] = run
            loaded.histories.pop(run.id, None)
            if history is not None:
                try:
                    loaded.histories[run.id] = RunHistory(HistoryDocument.model_validate(history))
                except (ValueError, TypeError) as error:  # the run is kept without it
                    histories_dropped.append(str(error).splitlines()[0])
        for run_id in removed:
            loaded.runs.pop(str(run_id), None)
            loaded.histories.pop(str(run_id), None)
        for what, problems in (("run", dropped), ("run history", histories_dropped)):
            if problems:
                problem = f"{len(problems)} stored {what}(s) did not validate and were dropped (first: {problems[0]})"
                logger.warning("State snapshot in %s: %s.", self.store.uri, problem)
                loaded.problems.append(problem)

    def _set_aside(self, names: list[str], why: str, loaded: Loaded) -> None:
        folder = SET_ASIDE_PREFIX + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        for name in names:
            self.store.move(name, f"{folder}/{name}")
        problem = f"{names[0]} {why}; set aside in {self.store.path(folder)}"
        logger.error("State snapshot in %s: %s. The state actor starts without it.", self.store.uri, problem)
        loaded.problems.append(problem)


def _encode(header: dict[str, Any], documents: list[str]) -> bytes:
    # The runs are spliced in as the JSON documents the actor keeps: no model is rebuilt to write them.
    head = json.dumps(
        {"format": FORMAT, "schema_version": SCHEMA_VERSION, "written_at": time.time(), **header},
        separators=(",", ":"),
    )
    return f'{head[:-1]},"runs":[{",".join(documents)}]}}'.encode()


def _decode(data: bytes, kind: str, name: str) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except ValueError as error:
        raise Unreadable(f"is not valid JSON ({error})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT or document.get("kind") != kind:
        raise Unreadable(f"is not an elastrain-state {kind} file")
    version = document.get("schema_version")
    if not isinstance(version, int):
        raise Unreadable("has no schema_version")
    if version > SCHEMA_VERSION:
        raise Unreadable(
            f"was written by a newer elastrain-state (schema_version {version}; this one reads up to "
            f"{SCHEMA_VERSION}): upgrade elastrain-state to read it"
        )
    if not isinstance(document.get("runs"), list) or not isinstance(document.get("removed", []), list):
        raise Unreadable(f"is not an elastrain-state {kind} file (no list of runs)")
    return document
