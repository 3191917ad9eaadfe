"""Persist an elastic job's committed state every N commits, and start a fresh job from the latest one.

Works with ``elastrain.executor.elastic`` states through their ``persist_with`` hook; nothing here imports the
executor. The object is built on the driver and shipped to the workers: each worker opens its own store lazily.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import pickle
import shutil
import tempfile
import threading
from collections.abc import Mapping
from typing import Any

from elastrain.durable._private.store import CheckpointStore
from elastrain.durable._private.sync_client import SyncClient

logger = logging.getLogger("elastrain.durable")
_STATE_FILE = "state.pkl"


class StatePersistence:
    """``state.persist_with(StatePersistence("s3://bucket/job", every=10))``.

    Rank 0 pickles the committed copy every ``every`` commits and saves it in the background (the training
    thread only hands the copy over; if the previous upload still runs, it waits for it). When a job starts
    with no committed state anywhere, every worker loads the latest persisted one. Snapshots are pickles:
    load only from storage you trust, as with ``torch.load``.
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
        self._writer: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: concurrent.futures.Future[None] | None = None
        self._lock = threading.Lock()

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
        if state.commits % self.every:
            return
        if self._pending is not None:
            concurrent.futures.wait([self._pending])  # one upload at a time: the only wait
        if self._writer is None:
            self._writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="elastrain-persist")
        self._pending = self._writer.submit(self._persist, state.snapshot(), state.commits)

    def latest(self) -> str | None:
        checkpoint = self.store.latest()
        return None if checkpoint is None else checkpoint.name

    def load(self, name: str) -> tuple[Any, int]:
        with tempfile.TemporaryDirectory(prefix="elastrain-persist-") as scratch:
            target = os.path.join(scratch, "state")
            checkpoint = self.store.restore(name, local_dir=target)
            with open(os.path.join(target, _STATE_FILE), "rb") as reader:
                snapshot = pickle.load(reader)  # noqa: S301 - the job's own state, from its own store
        commits = int(checkpoint.metrics["commits"])
        logger.info("Loaded persisted state %s (commit %d).", checkpoint.uri, commits)
        return snapshot, commits

    def flush(self) -> None:
        """Wait for the upload in flight; raise its error."""
        if self._pending is not None:
            self._pending.result()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            if self._writer is not None:
                self._writer.shutdown(wait=True)
            if self._store is not None:
                self._store.close()

    def _persist(self, snapshot: Any, commits: int) -> None:
        scratch = tempfile.mkdtemp(prefix="elastrain-persist-")
        try:
            with open(os.path.join(scratch, _STATE_FILE), "wb") as writer:
                pickle.dump(snapshot, writer, protocol=pickle.HIGHEST_PROTOCOL)
            self.store.save_async(scratch, metrics={"commits": commits}, step=commits, staging="move").result()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
