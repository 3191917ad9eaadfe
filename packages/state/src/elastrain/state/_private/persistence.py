"""The state actor's persistence: one background thread loads the snapshot, then writes what changed.

Nothing here runs on the actor's call thread. The thread first loads (retrying while the store fails; nothing
is written before a load succeeded, so a snapshot is never replaced by less than it held), hands the runs to
the actor, and compacts them into a new base. Then, every ``interval_s`` and only when runs changed, it writes
a journal segment holding just the changed runs (and the ids retention evicted). When the journal outgrows the
base (or holds MAX_SEGMENTS segments) the next round writes a new base instead. At 10,000 stored runs with a
few running, a round writes a few KiB instead of the ~17 MB a full rewrite took.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from elastrain.state._private.history import RunHistory
from elastrain.state._private.schemas import TrainRunInfo
from elastrain.state._private.snapshot import Snapshots
from elastrain.state._private.store import Store

logger = logging.getLogger("elastrain.state")

# A new base is written when the journal holds this many segments, or more bytes than the base (at least
# COMPACT_MIN_BYTES, so that a small table is not rewritten for every few changes).
MAX_SEGMENTS = 128
COMPACT_MIN_BYTES = 1 << 20
_LOAD_RETRY_MAX_S = 60.0


class Persistence:
    """``documents(ids)`` gives the stored JSON document of each id (None when gone); ``all_documents()`` every
        run's; ``restore(runs, cluster_id, histories)`` takes the loaded runs, the id of the Ray cluster that wrote them
    and the runs' histories (by run id).
        Each takes the actor's lock itself. ``cluster_id``: this cluster's, written with every file."""

    def __init__(
        self,
        uri: str,
        *,
        interval_s: float,
        timeout_s: float,
        documents: Callable[[list[str]], dict[str, str | None]],
        all_documents: Callable[[], list[str]],
        restore: Callable[[dict[str, TrainRunInfo], str | None, dict[str, RunHistory]], None],
        cluster_id: str | None = None,
    ) -> None:
        self.uri = uri
        self.timeout_s = timeout_s
        self._interval = interval_s
        self._snapshots = Snapshots(Store(uri, timeout_s), cluster_id)
        self._documents, self._all_documents, self._restore = documents, all_documents, restore
        self._changes = threading.Lock()
        self._changed: set[str] = set()
        self._removed: set[str] = set()
        self._wake = threading.Event()
        self._done = threading.Condition()
        self._requested = 0  # flush tickets handed out
        self._served = 0  # the last ticket a finished round covered
        self._round_error: BaseException | None = None
        self._stopped: str | None = None
        # What the folder holds now.
        self.loaded = False
        self._generation = 0
        self._seq = 1
        self._base_bytes = 0
        self._journal_bytes = 0
        self._segments = 0
        self._compact = True  # the first round after loading writes a base
        # For info().
        self.writes = 0
        self.failures = 0
        self.last_write: dict[str, Any] | None = None
        self.problems: list[str] = []
        self.error: str | None = None
        threading.Thread(target=self._main, name="elastrain-state-persistence", daemon=True).start()

    # -- the actor's side (call thread) --------------------------------------------------------------------

    def changed(self, run_id: str) -> None:
        with self._changes:
            self._changed.add(run_id)
            self._removed.discard(run_id)

    def removed(self, run_id: str) -> None:
        with self._changes:
            self._removed.add(run_id)
            self._changed.discard(run_id)

    def flush(self) -> None:
        """Ask for a round now and wait for it (at most twice ``timeout_s``); raise when it failed."""
        with self._done:
            self._requested += 1
            ticket = self._requested
        self._wake.set()
        deadline = time.monotonic() + 2 * self.timeout_s
        with self._done:
            while self._served < ticket:
                if self._stopped is not None:
                    raise RuntimeError(self._stopped)
                left = deadline - time.monotonic()
                if left <= 0:
                    state = "writing" if self.loaded else f"loading ({self.error or 'in progress'})"
                    raise TimeoutError(f"the state snapshot in {self.uri} is still {state}; it goes on in background")
                self._done.wait(left)
            if self._round_error is not None:
                raise self._round_error

    def info(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "loaded": self.loaded,
            "generation": self._generation,
            "segments": self._segments,
            "base_bytes": self._base_bytes,
            "journal_bytes": self._journal_bytes,
            "writes": self.writes,
            "failures": self.failures,
            "last_write": self.last_write,
            "error": self.error,
            "problems": list(self.problems),
        }

    # -- the background thread -----------------------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._serve()
        except BaseException as failure:  # a bug: say so, and let flush() fail at once instead of waiting
            logger.exception("The state snapshot thread stopped; nothing more is persisted.")
            with self._done:
                self._stopped = f"the snapshot thread stopped: {failure!r}"
                self.error = self._stopped
                self._done.notify_all()

    def _serve(self) -> None:
        self._load()
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            with self._done:
                ticket = self._requested
            error: BaseException | None = None
            try:
                self._round()
            except Exception as failure:  # the changes stay marked: the next round writes them
                error = failure
                self._failed(f"writing the snapshot failed: {failure}")
            with self._done:
                self._served, self._round_error = ticket, error
                self._done.notify_all()

    def _load(self) -> None:
        pause = min(max(self._interval, 1.0), _LOAD_RETRY_MAX_S)
        while True:
            try:
                loaded = self._snapshots.load()
                break
            except Exception as failure:  # the store is down: try again, never write over what it may hold
                self._failed(f"loading the snapshot failed (retrying; nothing is written until it loads): {failure}")
                self._wake.wait(pause)
                self._wake.clear()
                pause = min(pause * 2, _LOAD_RETRY_MAX_S)
        self._restore(loaded.runs, loaded.cluster_id, loaded.histories)
        self._generation, self._seq = loaded.generation, loaded.next_seq
        self._base_bytes, self._journal_bytes, self._segments = (
            loaded.base_bytes,
            loaded.journal_bytes,
            loaded.segments,
        )
        self.problems = loaded.problems
        self.error = None
        self.loaded = True
        if loaded.runs:
            logger.info("Loaded %d runs from the state snapshot in %s.", len(loaded.runs), self.uri)

    def _round(self) -> None:
        with self._changes:
            changed, removed = self._changed, self._removed
            self._changed, self._removed = set(), set()
        if not (changed or removed or self._compact):
            return  # nothing changed: nothing is written
        started = time.perf_counter()
        try:
            if self._compact or self._journal_due():
                kind, runs, size = "base", *self._write_base()
            else:
                kind, runs, size = "journal", *self._write_segment(changed, removed)
        except BaseException:
            with self._changes:  # write them next round, unless something newer was marked meanwhile
                self._changed |= changed - self._removed
                self._removed |= removed - self._changed
            raise
        seconds = time.perf_counter() - started
        self.writes += 1
        self.last_write = {"kind": kind, "runs": runs, "removed": len(removed), "bytes": size, "seconds": seconds}
        if self.error is not None:
            logger.info("The state snapshot in %s is written again.", self.uri)
        self.error = None

    def _journal_due(self) -> bool:
        return self._segments >= MAX_SEGMENTS or self._journal_bytes > max(self._base_bytes, COMPACT_MIN_BYTES)

    def _write_base(self) -> tuple[int, int]:
        documents = self._all_documents()
        self._generation += 1  # a failed or late write never shares a name with a later one
        self._seq = 1
        self._compact = True
        size = self._snapshots.write_base(self._generation, documents)
        self._compact = False
        self._base_bytes, self._journal_bytes, self._segments = size, 0, 0
        return len(documents), size

    def _write_segment(self, changed: set[str], removed: set[str]) -> tuple[int, int]:
        found = self._documents(sorted(changed))
        documents = [document for document in found.values() if document is not None]
        gone = sorted(removed | {run_id for run_id, document in found.items() if document is None})
        seq, self._seq = self._seq, self._seq + 1
        size = self._snapshots.write_segment(self._generation, seq, documents, gone)
        self._journal_bytes += size
        self._segments += 1
        return len(documents), size

    def _failed(self, message: str) -> None:
        self.failures += 1
        if self.error is None:  # one warning per outage, not one per round
            logger.warning("State snapshot in %s: %s", self.uri, message)
        self.error = message
