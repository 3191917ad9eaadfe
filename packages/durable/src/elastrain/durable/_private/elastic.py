"""Persist an elastic job's committed state every N commits, and start a fresh job from the latest one.

Works with ``elastrain.executor.elastic`` states through their ``persist_with`` hook; nothing here imports the
executor. The object is built on the driver and shipped to the workers: each worker opens its own store lazily.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import pickle
import shutil
import tempfile
import threading
from collections.abc import Mapping
from typing import Any

from elastrain.durable._private.errors import StaleCheckpointError
from elastrain.durable._private.store import CheckpointStore
from elastrain.durable._private.sync_client import SyncClient

logger = logging.getLogger("elastrain.durable")
_STATE_FILE = "state.pkl"


class StatePersistence:
    """``state.persist_with(StatePersistence("s3://bucket/job", every=10))``.

    Rank 0 pickles the committed copy every ``every`` commits and saves it in the background: the training
    thread only hands the copy over and never waits (while an upload runs, the newest copy waits its turn and
    older ones are dropped, so a slow store persists less often, never blocks a collective). When a job starts
    with no committed state anywhere, every worker loads the latest persisted one (falling back to an older
    one if it is corrupted). Snapshots are pickles: load only from storage you trust, as with ``torch.load``.
    """

    def __init__(
        self,
        uri: str | os.PathLike[str],
        *,
        every: int = 10,
        num_to_keep: int | None = 2,
        storage_options: Mapping[str, Any] | None = None,
        sync_client: SyncClient | None = None,
        timeout_s: float = 3600.0,
    ) -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive int (persist every N commits), got {every!r}.")
        self.uri = os.fspath(uri)
        self.every = every
        self._store_options: dict[str, Any] = {
            "num_to_keep": num_to_keep,
            "storage_options": storage_options,
            "sync_client": sync_client,
            "timeout_s": timeout_s,
        }
        CheckpointStore(self.uri, **self._store_options).close()  # bad options fail here, on the driver
        self._local()

    def _local(self) -> None:
        self._store: CheckpointStore | None = None
        self._lock = threading.Lock()
        self._queued: tuple[Any, int] | None = None  # the newest copy waiting for the upload in flight
        self._writing = False  # a writer thread is running (changed only under _lock)
        self._idle = threading.Event()
        self._idle.set()
        self._last_error: BaseException | None = None
        self._refused = 0  # saves refused in a row as older than what is committed
        self._prefetched: concurrent.futures.Future[tuple[str, Any, int] | None] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"uri": self.uri, "every": self.every, "_store_options": self._store_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._local()

    def __repr__(self) -> str:
        return f"StatePersistence({self.store!r}, every={self.every})"

    @property
    def store(self) -> CheckpointStore:
        with self._lock:
            if self._store is None:
                self._store = CheckpointStore(self.uri, **self._store_options)
            return self._store

    # -- the hook elastic states call -------------------------------------------------------------------------

    def committed(self, state: Any) -> None:
        commits = _commit_count(state)
        if commits % self.every:
            return
        with self._lock:
            self._queued = (state.snapshot(), commits)
            self._idle.clear()
            if not self._writing:
                self._writing = True
                threading.Thread(target=self._write_queued, name="elastrain-persist", daemon=True).start()

    def rank_changed(self, rank: int) -> None:
        """Called by the executor at every reset with this worker's new rank: a worker that is no longer rank 0
        drops the copy it still had queued (the new rank 0 persists from now on; one already uploading is fenced
        by the store, which never lets an older step become latest)."""
        if rank == 0:
            return
        with self._lock:
            dropped, self._queued = self._queued, None
        if dropped is not None:
            logger.info("Dropped the queued copy of commit %d: this worker is rank %d now.", dropped[1], rank)

    def prefetch(self) -> None:
        """Start loading the latest persisted state in the background, so that a job that will resume from it
        (every worker of a restarted job) overlaps the download with building its model; :meth:`load` of that
        checkpoint then takes the loaded copy. Call it early in the worker, before the first sync."""
        with self._lock:
            if self._prefetched is not None:
                return
            future = self._prefetched = concurrent.futures.Future()
        threading.Thread(target=self._prefetch, args=(future,), name="elastrain-prefetch", daemon=True).start()

    def _prefetch(self, future: concurrent.futures.Future[tuple[str, Any, int] | None]) -> None:
        try:
            name = self.latest()
            future.set_result(None if name is None else (name, *self._load(name)))
        except BaseException as error:  # load() reads afresh, and reports its own error, when the state asks
            future.set_exception(error)

    def latest(self) -> str | None:
        checkpoint = self.store.latest()
        return None if checkpoint is None else checkpoint.name

    def load(self, name: str) -> tuple[Any, int]:
        prefetched = self._prefetched
        if prefetched is not None:
            loaded = None
            with contextlib.suppress(Exception):  # a failed prefetch: read again below
                loaded = prefetched.result(timeout=self._store_options["timeout_s"])
            with self._lock:  # used once: the copy is not kept in memory for the rest of the job
                self._prefetched = concurrent.futures.Future()
                self._prefetched.set_result(None)
            if loaded is not None and loaded[0] == name:
                return loaded[1], loaded[2]
        return self._load(name)

    def _load(self, name: str) -> tuple[Any, int]:
        with tempfile.TemporaryDirectory(prefix="elastrain-persist-") as scratch:
            target = os.path.join(scratch, "state")
            checkpoint = self.store.restore(name, local_dir=target, fallback=True)
            with open(os.path.join(target, _STATE_FILE), "rb") as reader:
                snapshot = pickle.load(reader)  # noqa: S301 - the job's own state, from its own store
        commits = int(checkpoint.metrics["commits"])
        logger.info("Loaded persisted state %s (commit %d).", checkpoint.uri, commits)
        return snapshot, commits

    def flush(self, timeout: float | None = None) -> None:
        """Wait until the newest handed-over copy is persisted and collected; raise the last upload's error, if any.

        Collection is waited for too: the worker process may be stopped as soon as the job returns, and a
        collection cut short would leave more than ``num_to_keep`` copies behind.
        """
        if not self._idle.wait(timeout):
            raise TimeoutError(f"Persisting state to {self.uri} is still running after {timeout} s.")
        store = self._store
        if store is not None:
            store.wait(timeout)
        error, self._last_error = self._last_error, None
        if error is not None:
            raise error

    def close(self) -> None:
        try:
            self.flush()
        finally:
            if self._store is not None:
                self._store.close()

    def _write_queued(self) -> None:
        while True:
            with self._lock:
                queued, self._queued = self._queued, None
                if queued is None:
                    self._writing = False
                    self._idle.set()
                    return
            try:
                self._persist(*queued)
                self._last_error = None
                self._refused = 0
            except StaleCheckpointError as error:  # a newer rank 0 has persisted a later commit: nothing lost
                self._refused += 1
                # Once is expected after a reset; again and again means this worker's copies never count.
                logger.log(logging.WARNING if self._refused > 1 else logging.INFO, "%s", error)
            except Exception as error:  # reported here and by flush(); training goes on
                self._last_error = error
                logger.warning("Persisting elastic state (commit %d) failed: %s", queued[1], error)

    def _persist(self, snapshot: Any, commits: int) -> None:
        scratch = tempfile.mkdtemp(prefix="elastrain-persist-")
        try:
            with open(os.path.join(scratch, _STATE_FILE), "wb") as writer:
                pickle.dump(snapshot, writer, protocol=pickle.HIGHEST_PROTOCOL)
            self.store.save_async(scratch, metrics={"commits": commits}, step=commits, staging="move").result()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def _commit_count(state: Any) -> int:
    """The state's commit count: ``commit_count``, or ``commits`` on executors that predate it."""
    count = getattr(state, "commit_count", None)
    return int(state.commits if count is None else count)
