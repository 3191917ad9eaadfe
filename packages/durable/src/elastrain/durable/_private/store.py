"""CheckpointStore: save and restore checkpoints on any fsspec URI, with atomic commits and garbage collection.

Layout under the store's URI::

    checkpoint_000000007_1f2e3d/...            the checkpoint's files, uploaded first
    _manifests/checkpoint_000000007_1f2e3d/MANIFEST.json   written last: the commit

A checkpoint exists (is listed, can be restored) only once its manifest is there; garbage collection removes the
manifest first and the files after, so a listed checkpoint always has all its files. Folders without a manifest
are unfinished uploads, removed by a later collection. Any number of stores read a URI. Writers are fenced by
step: a save whose step is below one already committed is refused (``StaleCheckpointError``), and checkpoints
are ordered by step, so a late copy from a former writer never becomes latest nor pushes newer ones out.
"""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from elastrain.durable._private import checkpoint as ckpt
from elastrain.durable._private import restoring, uploading
from elastrain.durable._private.checkpoint import Checkpoint
from elastrain.durable._private.checks import check_options, check_writable
from elastrain.durable._private.collection import Collector
from elastrain.durable._private.errors import (
    StaleCheckpointError,
    StorageTimeoutError,
)
from elastrain.durable._private.fsspec_client import FsspecSyncClient
from elastrain.durable._private.futures import CheckpointFuture
from elastrain.durable._private.location import import_backend, parse_location, redact, secret_values
from elastrain.durable._private.readers import Readers
from elastrain.durable._private.retry import with_retries
from elastrain.durable._private.s3_transfer import s3_storage_options
from elastrain.durable._private.staging import (
    STAGING_MODES,
    StagingMode,
    stage,
)
from elastrain.durable._private.sync_client import SyncClient

logger = logging.getLogger("elastrain.durable")

# Reading manifests is a small, quick operation: it gets its own deadline.
_METADATA_TIMEOUT_S = 120.0
# Manifests read at once: one metadata deadline per batch (clients that run a command per file are slow).
_MANIFEST_BATCH = 32


class CheckpointStore:
    """Checkpoints under one URI (a path, ``file://``, ``s3://``, ``gs://``, ``memory://`` or any fsspec URI).

    ``num_to_keep``: at most this many committed checkpoints remain (the latest always; the others the best by
    ``score_attribute``, or the newest). ``timeout_s`` bounds each upload, download and delete as a whole;
    ``retries`` bounds the attempts within it. ``staging_dir``: where ``save_async`` keeps its private copy.
    """

    def __init__(
        self,
        uri: str | os.PathLike[str],
        *,
        num_to_keep: int | None = None,
        score_attribute: str | None = None,
        score_order: str = "max",
        storage_options: Mapping[str, Any] | None = None,
        sync_client: SyncClient | None = None,
        timeout_s: float = 3600.0,
        retries: int = 3,
        staging_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        check_options(num_to_keep, score_attribute, score_order, timeout_s, retries)
        self.location = parse_location(uri)
        self.num_to_keep = num_to_keep
        self.score_attribute = score_attribute
        self.score_order = score_order
        self.timeout_s = float(timeout_s)
        self.retries = retries
        self._secrets = secret_values(storage_options)
        if sync_client is not None and storage_options:
            raise ValueError("Pass storage_options or sync_client, not both: the client brings its own settings.")
        if sync_client is not None and not isinstance(sync_client, SyncClient):
            raise TypeError(f"sync_client must be a SyncClient, got {type(sync_client).__name__}.")
        self.client = sync_client if sync_client is not None else _default_client(self.location, storage_options)
        if self.location.is_local and sync_client is None:
            check_writable(self.location.local_path(), "the store's folder")
        self._staging_parent = None if staging_dir is None else os.fspath(staging_dir)
        self._staging_root: str | None = None
        self._uploads = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="elastrain-durable-upload")
        self._restores = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="elastrain-durable-restore")
        self._hashing = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="elastrain-durable-describe")
        self._collection: concurrent.futures.Future[None] | None = None
        self._save_lock = threading.Lock()
        self._pending: CheckpointFuture | None = None
        self._manifests: dict[str, Checkpoint] = {}
        self._manifest_lock = threading.Lock()
        self._failed_uploads: set[str] = set()  # touched only by the upload thread
        self._readers = Readers(self.location, self.client, self._retry, self._redact)
        self._collector = Collector(self.location, self.client, self._retry, self._list_names, self._readers)
        self._next_sequence: int | None = None
        self._closed = False

    def __repr__(self) -> str:
        return f"CheckpointStore({self.location.display!r}, num_to_keep={self.num_to_keep!r})"

    def __enter__(self) -> CheckpointStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if exc_info[0] is None:
            self.close()
            return
        try:  # an error is already on its way: don't hide it behind an upload's
            self.close()
        except Exception as error:
            logger.warning("Closing %r after an error: %s", self, self._redact(str(error)))

    # -- saving ----------------------------------------------------------------------------------------------

    def save(
        self, local_dir: str | os.PathLike[str], *, metrics: Mapping[str, Any] | None = None, step: int | None = None
    ) -> Checkpoint:
        """Save ``local_dir``'s files and return once the checkpoint is committed.

        The caller waits anyway, so the files are uploaded from ``local_dir`` itself, without a staged copy.
        """
        return self._save(local_dir, metrics, step, staging=None).result()

    def save_async(
        self,
        local_dir: str | os.PathLike[str],
        *,
        metrics: Mapping[str, Any] | None = None,
        step: int | None = None,
        staging: StagingMode = "copy",
    ) -> CheckpointFuture:
        """Stage ``local_dir`` and upload it in the background; the future gives the committed checkpoint.

        Returns once the files are staged: ``copy`` (default), ``link`` (hard links: don't rewrite the files in
        place before the upload ends) or ``move`` (the folder is handed over). One upload runs at a time; a call
        while one runs first waits for it, the only time training waits.
        """
        if staging not in STAGING_MODES:
            raise ValueError(f"staging must be one of {', '.join(STAGING_MODES)}, got {staging!r}.")
        return self._save(local_dir, metrics, step, staging)

    def _save(
        self,
        local_dir: str | os.PathLike[str],
        metrics: Mapping[str, Any] | None,
        step: int | None,
        staging: StagingMode | None,
    ) -> CheckpointFuture:
        """Stage (``staging=None``: describe the files where they are) and hand the upload to the upload thread."""
        source = Path(local_dir)
        metrics = ckpt.check_metrics(metrics)
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            raise TypeError(f"step must be an int or None, got {step!r}.")
        with self._save_lock:
            self._check_open()
            if not source.is_dir():
                raise NotADirectoryError(f"save needs a folder of checkpoint files; {str(source)!r} is not one.")
            previous = self._pending
            if previous is not None:
                concurrent.futures.wait([previous._future])
                error = previous._future.exception()
                if error is not None and not previous.observed:
                    logger.warning("The previous upload failed and nobody looked: %s", self._redact(str(error)))
                    previous.observed = True
            if staging is None:
                staged, owned = source, False
            else:
                staged, owned = Path(self._staging()) / uuid.uuid4().hex, True
                try:
                    stage(source, staged, staging)
                except BaseException:
                    shutil.rmtree(staged, ignore_errors=True)
                    raise
            # Naming and hashing happen in the upload thread: saving never waits on storage or checksums.
            upload = self._uploads.submit(self._upload_and_commit, staged, owned, step, metrics, staging)
            self._pending = CheckpointFuture(upload)
            # Collection runs after the commit, in the same thread: the commit's future does not wait for it.
            self._collection = self._uploads.submit(self._collect_after, upload)
            return self._pending

    async def asave(
        self,
        local_dir: str | os.PathLike[str],
        *,
        metrics: Mapping[str, Any] | None = None,
        step: int | None = None,
        staging: StagingMode = "copy",
    ) -> CheckpointFuture:
        """``save_async`` for event loops (async Ray actors): waiting and staging happen off the loop.

        ``future = await store.asave(path)`` returns once staged; ``await future`` waits for the commit.
        """
        return await asyncio.to_thread(self.save_async, local_dir, metrics=metrics, step=step, staging=staging)

    def _upload_and_commit(
        self, staged: Path, owned: bool, step: int | None, metrics: dict[str, Any], staging: StagingMode | None
    ) -> Checkpoint:
        # One deadline for the whole save: its upload marker promises collection no more than that.
        deadline = time.monotonic() + self.timeout_s
        name = ""
        try:
            self._fence(step, deadline)
            sequence = self._allocate_sequence(deadline)
            name = ckpt.new_name(sequence)
            self._collector.mark_pending(name, self.timeout_s, deadline)
            files = uploading.upload_described(self, staged, name, staging, deadline)
            self._fence(step, deadline, uploaded=name)  # again: another writer may have committed meanwhile
            manifest = ckpt.encode_manifest(
                name=name, sequence=sequence, step=step, metrics=metrics, created_at=time.time(), files=files
            )
            self._retry(
                lambda left: self.client.write_bytes(self._manifest_uri(name), manifest, timeout_s=left),
                f"committing {self.location.display_join(name)}",
                deadline=deadline,
            )
        except BaseException as error:
            # Collected by the next commit's collection; not one that timed out: a write abandoned at its
            # deadline might still land, so its marker's deadline (plus margin) decides instead.
            if name and not isinstance(error, TimeoutError):
                self._failed_uploads.add(name)
            raise
        finally:
            if owned:
                shutil.rmtree(staged, ignore_errors=True)
        self._collector.clear_pending(name)
        checkpoint = ckpt.decode_manifest(manifest, self.location.display_join(name))
        with self._manifest_lock:
            self._manifests[name] = checkpoint
        logger.info("Committed %s (%d files, %d bytes).", checkpoint.uri, len(files), checkpoint.total_bytes)
        return checkpoint

    def _fence(self, step: int | None, deadline: float, uploaded: str = "") -> None:
        """Refuse to commit a step older than one already committed (a former writer's late copy)."""
        if step is None:
            return
        newer = [c.step for c in self._committed(deadline=deadline) if c.step is not None and c.step > step]
        if not newer:
            return
        if uploaded:
            self._delete_quietly(uploaded, deadline)
        raise StaleCheckpointError(
            f"Not committing step {step} to {self.location.display}: step {max(newer)} is already committed there "
            "(another writer has moved on, as a new rank 0 does after an elastic reset). Checkpoints are ordered "
            "by step; save with a step at least as high as the latest one's."
        )

    def _delete_quietly(self, name: str, deadline: float) -> None:
        try:
            self._retry(
                lambda left: self.client.delete(self.location.join(name), timeout_s=left),
                f"removing {self.location.display_join(name)}",
                deadline=deadline,
            )
            self._collector.clear_pending(name)
        except Exception as error:  # its marker stays: collection removes it after the deadline
            logger.info("Could not remove the refused upload %s yet (%s).", name, type(error).__name__)

    def _collect_after(self, upload: concurrent.futures.Future[Checkpoint]) -> None:
        if upload.exception() is None:
            self._collect_garbage(upload.result().sequence)

    def _allocate_sequence(self, deadline: float) -> int:
        """Above everything in the store, looked up at every save: another writer may have taken over meanwhile
        (elastic state persisted by whichever worker is rank 0)."""
        sequence = max(self._collector.highest_sequence(deadline) + 1, self._next_sequence or 0)
        self._next_sequence = sequence + 1
        return sequence

    # -- reading ---------------------------------------------------------------------------------------------

    def list(self) -> builtins.list[Checkpoint]:
        """Committed checkpoints, oldest first: by step, then by commit (ones due for collection left out)."""
        committed = self._committed()
        if self.num_to_keep is None:
            return committed
        return ckpt.checkpoints_to_keep(committed, self.num_to_keep, self.score_attribute, self.score_order)

    def latest(self) -> Checkpoint | None:
        checkpoints = self.list()
        return checkpoints[-1] if checkpoints else None

    def best(self) -> Checkpoint | None:
        """The committed checkpoint with the best ``score_attribute`` (ties: the newer one)."""
        if self.score_attribute is None:
            raise ValueError("best() ranks by score: create the store with score_attribute='<metric name>'.")
        attribute, order = self.score_attribute, self.score_order
        checkpoints = self.list()
        if not checkpoints:
            return None
        return max(checkpoints, key=lambda c: (ckpt.score_key(c, attribute, order), ckpt.order_key(c)))

    def restore(
        self,
        checkpoint: Checkpoint | str | None = None,
        *,
        local_dir: str | os.PathLike[str],
        fallback: bool = False,
    ) -> Checkpoint:
        """Download a checkpoint (default: the latest) into ``local_dir`` (new or empty) and verify every file.

        A corrupted checkpoint raises ``CheckpointCorruptedError``; with ``fallback=True`` the next older
        committed checkpoint is tried instead. Returns the checkpoint that was restored.
        """
        target = Path(local_dir)
        if target.exists() and (not target.is_dir() or any(target.iterdir())):
            raise FileExistsError(f"restore writes into a new or empty folder; {str(target)!r} is not empty.")
        check_writable(str(target.parent), "the folder to restore into")
        return restoring.restore(self, checkpoint, target, fallback)

    def restore_async(
        self,
        checkpoint: Checkpoint | str | None = None,
        *,
        local_dir: str | os.PathLike[str],
        fallback: bool = False,
    ) -> CheckpointFuture:
        """``restore`` in the background; await the future in an event loop, or call ``result()``."""
        self._check_open()
        return CheckpointFuture(self._restores.submit(self.restore, checkpoint, local_dir=local_dir, fallback=fallback))

    async def arestore(
        self,
        checkpoint: Checkpoint | str | None = None,
        *,
        local_dir: str | os.PathLike[str],
        fallback: bool = False,
    ) -> Checkpoint:
        return await self.restore_async(checkpoint, local_dir=local_dir, fallback=fallback)

    # -- flushing --------------------------------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the upload in flight (and its garbage collection).

        If it failed and its future's outcome was never looked at, raise its error here, so it is not lost.
        """
        pending, collection = self._pending, self._collection
        if pending is None:
            return
        waiting: builtins.list[concurrent.futures.Future[Any]] = [pending._future]
        if collection is not None:
            waiting.append(collection)
        concurrent.futures.wait(waiting, timeout)
        if not pending._future.done() or (collection is not None and not collection.done()):
            raise TimeoutError(f"The upload to {self.location.display} is still running after {timeout} s.")
        if not pending.observed:
            pending.result()

    def close(self) -> None:
        """Flush the upload in flight, then release threads, the client and the staging folder."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            self._uploads.shutdown(wait=True)
            self._restores.shutdown(wait=True)
            self._hashing.shutdown(wait=True)
            self.client.close()
            if self._staging_root is not None:
                shutil.rmtree(self._staging_root, ignore_errors=True)

    # -- garbage collection ------------------------------------------------------------------------------------

    def _collect_garbage(self, committed_sequence: int) -> None:
        """Delete what the keep rules drop, then abandoned uploads. Never raises: the next commit retries.

        The store's root and the upload markers are listed before the manifests: a checkpoint committed while
        collection looks is then either seen with its marker (an upload in progress, left alone) or with its
        manifest, never as a folder with neither.
        """
        try:
            doomed: builtins.list[str] = []
            root = self._collector.list_root()
            markers = self._collector.list_markers()
            listed = self._list_names(self.location.join(ckpt.MANIFEST_DIR))
            committed, absent = self._scan_manifests(listed)
            if self.num_to_keep is not None:
                keep = ckpt.checkpoints_to_keep(committed, self.num_to_keep, self.score_attribute, self.score_order)
                kept = {c.name for c in keep}
                doomed = [c.name for c in committed if c.name not in kept]
            manifests = set(listed) - absent
            self._collector.collect(doomed, committed_sequence, self._failed_uploads, manifests, markers, root, absent)
        except Exception as error:
            logger.warning("Garbage collection under %s failed: %s", self.location.display, self._redact(str(error)))

    # -- helpers ---------------------------------------------------------------------------------------------

    def _committed(
        self, listed: builtins.list[str] | None = None, *, deadline: float | None = None
    ) -> builtins.list[Checkpoint]:
        """Committed checkpoints, from ``listed`` (the names under ``_manifests``) or a fresh listing, oldest first."""
        return self._scan_manifests(listed, deadline=deadline)[0]

    def _scan_manifests(
        self, listed: builtins.list[str] | None = None, *, deadline: float | None = None
    ) -> tuple[builtins.list[Checkpoint], set[str]]:
        """The committed checkpoints, oldest first, and the listed names whose manifest is absent: the folder of an
        uncommit cut short (stores with real folders, SeaweedFS or a local path, keep it once its file is gone).

        Manifests not seen before are read in batches (a new process may find hundreds), each batch under its own
        metadata deadline, and what a batch read is kept even if a later one fails.
        """
        if listed is None:
            listed = self._list_names(self.location.join(ckpt.MANIFEST_DIR), deadline=deadline)
        names = [n for n in listed if ckpt.sequence_of(n)]
        with self._manifest_lock:
            known = {name: self._manifests[name] for name in names if name in self._manifests}
        unknown = [name for name in names if name not in known]
        absent: set[str] = set()
        for start in range(0, len(unknown), _MANIFEST_BATCH):
            uris = {self._manifest_uri(name): name for name in unknown[start : start + _MANIFEST_BATCH]}
            found = self._retry(
                lambda left, batch=list(uris): self.client.read_many(batch, timeout_s=left),
                f"reading {len(uris)} manifests",
                timeout_s=_METADATA_TIMEOUT_S,
                deadline=deadline,
            )
            for uri, data in found.items():
                if data is None:
                    absent.add(uris[uri])
                    continue
                checkpoint = self._decode(data, uris[uri])
                if checkpoint is not None:
                    known[checkpoint.name] = checkpoint
                    with self._manifest_lock:
                        self._manifests[checkpoint.name] = checkpoint
        with self._manifest_lock:
            self._manifests.update(known)
            for gone in set(self._manifests) - set(names):
                self._manifests.pop(gone, None)
        return sorted(known.values(), key=ckpt.order_key), absent

    def _read_manifest(self, name: str) -> Checkpoint | None:
        try:
            data = self._retry(
                lambda left: self.client.read_bytes(self._manifest_uri(name), timeout_s=left),
                f"reading the manifest of {name}",
                timeout_s=_METADATA_TIMEOUT_S,
            )
        except FileNotFoundError:
            # Collected since it was listed: forget it, or list() would go on offering it from what it read before.
            with self._manifest_lock:
                self._manifests.pop(name, None)
            return None
        return self._decode(data, name)

    def _decode(self, data: bytes, name: str) -> Checkpoint | None:
        try:
            return ckpt.decode_manifest(data, self.location.display_join(name))
        except (ValueError, KeyError, TypeError) as error:
            logger.warning("Ignoring %s: its manifest is unreadable (%s).", self.location.display_join(name), error)
            return None

    def _list_names(self, uri: str, *, deadline: float | None = None) -> builtins.list[str]:
        names: builtins.list[str] = self._retry(
            lambda left: self.client.list_names(uri, timeout_s=left),
            "listing checkpoints",
            timeout_s=_METADATA_TIMEOUT_S,
            deadline=deadline,
        )
        return names

    def _manifest_uri(self, name: str) -> str:
        return self.location.join(ckpt.MANIFEST_DIR, name, ckpt.MANIFEST_FILE)

    def _retry(self, operation: Any, what: str, timeout_s: float | None = None, deadline: float | None = None) -> Any:
        """``operation(time_left)`` with retries, within ``timeout_s`` (default the store's) and, when given, the
        ``deadline`` (a ``time.monotonic()`` value) of the save it is part of."""
        budget = self.timeout_s if timeout_s is None else min(timeout_s, self.timeout_s)
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StorageTimeoutError(f"Gave up {what}: the save's deadline of {self.timeout_s:.1f} s passed.")
            budget = min(budget, left)
        return with_retries(operation, what=what, timeout_s=budget, retries=self.retries, secrets=self._secrets)

    def _staging(self) -> str:
        if self._staging_root is None:
            if self._staging_parent is not None:
                check_writable(self._staging_parent, "staging_dir")
            self._staging_root = tempfile.mkdtemp(prefix="elastrain-durable-staging-", dir=self._staging_parent)
        return self._staging_root

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed; create a new CheckpointStore.")

    def _redact(self, text: str) -> str:
        return redact(text, self._secrets)


def _default_client(location: Any, storage_options: Mapping[str, Any] | None) -> SyncClient:
    if location.is_local:
        if storage_options:
            raise ValueError("storage_options are for remote storage; a local folder takes none.")
        return FsspecSyncClient()
    import_backend(location.protocol)
    import fsspec

    options = dict(storage_options or {})
    if location.protocol in ("s3", "s3a"):
        options = s3_storage_options(options)
    return FsspecSyncClient(fsspec.filesystem(location.protocol, **options))
