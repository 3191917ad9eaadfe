"""A checkpoint written by many writers at once: every rank of an elastic job uploads its own part.

The layout and the commit protocol are the store's (``store.py``): the parts go under the checkpoint's folder,
one sub-folder per part, and one manifest, written last, commits them all. The coordinator (rank 0) opens the
checkpoint (fenced by step, its upload marked as in progress, so collection leaves it alone), every writer
uploads its part and returns its file entries, and the coordinator commits once every part is in: it fences
again, adds the files only it writes (a format's index), and writes the manifest listing every file. A part that
never arrives leaves an unfinished upload, which collection removes after its deadline.

Nothing here knows the checkpoint's format or imports torch: the executor writes PyTorch DCP parts with it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from elastrain.durable._private import checkpoint as ckpt
from elastrain.durable._private import uploading
from elastrain.durable._private.checkpoint import FileEntry
from elastrain.durable._private.errors import (
    CheckpointCorruptedError,
    CheckpointNotFoundError,
    StaleCheckpointError,
)
from elastrain.durable._private.store import CheckpointStore
from elastrain.durable._private.sync_client import SyncClient

logger = logging.getLogger("elastrain.durable")


# A download's reader lease outlives its deadline by this much (clock differences between machines).
_LEASE_MARGIN_S = 300.0


def _commits(checkpoint: ckpt.Checkpoint) -> int:
    return int(checkpoint.metrics.get("commits", checkpoint.step or 0))


def verify_files(folder: Path, checkpoint: ckpt.Checkpoint, files: Sequence[FileEntry]) -> None:
    """Check the downloaded ``files`` of ``checkpoint`` in ``folder`` against its manifest."""
    for entry in files:
        path = folder / entry.path
        if not path.is_file():
            raise CheckpointCorruptedError(f"{checkpoint.uri} is corrupted: {entry.path} is missing.")
        digest = hashlib.sha256()
        size = 0
        with open(path, "rb") as reader:
            while chunk := reader.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
        if size != entry.size or digest.hexdigest() != entry.sha256:
            raise CheckpointCorruptedError(
                f"{checkpoint.uri} is corrupted: {entry.path} ({size} bytes) fails its size or SHA-256 check."
            )


class ShardedStatePersistence:
    """``state.persist_with(ShardedStatePersistence("s3://bucket/job", every=10))`` for sharded elastic state.

    Every ``every`` commits, each rank writes its own part of the committed state (in PyTorch's distributed
    checkpoint format, written by the executor) and uploads it in the background; the checkpoint commits once
    every part is uploaded, with one manifest, fenced by step and collected down to ``num_to_keep``. A job that
    loses its state, or starts on a URI that holds one, loads the latest at any world size. The checkpoints are
    plain DCP folders: ``torch.distributed.checkpoint.load`` reads a downloaded copy without elastrain.
    """

    #: Tells the executor that this persistence takes one part per rank (``begin``, ``upload_part``, ``commit``).
    sharded = True

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
        self._store: CheckpointStore | None = None
        self._open: dict[str, tuple[int, float]] = {}  # name -> (sequence, deadline) of checkpoints begun here

    def __getstate__(self) -> dict[str, Any]:
        return {"uri": self.uri, "every": self.every, "_store_options": self._store_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._store, self._open = None, {}

    def __repr__(self) -> str:
        return f"ShardedStatePersistence({self.uri!r}, every={self.every})"

    @property
    def store(self) -> CheckpointStore:
        if self._store is None:
            self._store = CheckpointStore(self.uri, **self._store_options)
        return self._store

    def due(self, commits: int) -> bool:
        return commits % self.every == 0

    # -- writing: begin on the coordinator, a part on every writer, commit on the coordinator -------------------

    def begin(self, step: int) -> str:
        """Open a checkpoint for ``step`` (the coordinator): its name, which every writer uploads under.

        Raises ``StaleCheckpointError`` when a later step is committed already (a former coordinator's late copy).
        """
        store = self.store
        deadline = time.monotonic() + store.timeout_s
        store._fence(step, deadline)
        sequence = store._allocate_sequence(deadline)
        name = ckpt.new_name(sequence)
        store._collector.mark_pending(name, store.timeout_s, deadline)
        self._open[name] = (sequence, deadline)
        return name

    def upload_part(self, name: str, part: str, local_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
        """Upload ``local_dir``'s files as part ``part`` of checkpoint ``name`` (any writer); the entries the
        coordinator's :meth:`commit` needs, describing the bytes uploaded."""
        if not part or "/" in part or part.startswith("."):
            raise ValueError(f"A part is a plain folder name, got {part!r}.")
        store = self.store
        deadline = time.monotonic() + store.timeout_s
        files = uploading.upload_described(store, Path(local_dir), f"{name}/{part}", "copy", deadline)
        return [{"path": f"{part}/{entry.path}", "size": entry.size, "sha256": entry.sha256} for entry in files]

    def commit(
        self,
        name: str,
        parts: Sequence[Sequence[Mapping[str, Any]]],
        *,
        step: int,
        metrics: Mapping[str, Any] | None = None,
        index_files: Mapping[str, bytes] | None = None,
    ) -> ckpt.Checkpoint:
        """Commit checkpoint ``name`` (the coordinator, once every part is uploaded): write ``index_files`` (e.g.
        DCP's ``.metadata``) at its top, then the manifest listing every file. Fenced again by ``step``."""
        store = self.store
        sequence, deadline = self._open.pop(name, (ckpt.sequence_of(name), time.monotonic() + store.timeout_s))
        if sequence is None:
            raise ValueError(f"{name!r} is not a checkpoint name this store writes.")
        try:
            store._fence(step, deadline, uploaded=name)
            files = [FileEntry(str(e["path"]), int(e["size"]), str(e["sha256"])) for part in parts for e in part]
            for relative, data in (index_files or {}).items():
                store._retry(
                    lambda left, relative=relative, data=data: store.client.write_bytes(
                        store.location.join(name, relative), data, timeout_s=left
                    ),
                    f"writing {relative} of {store.location.display_join(name)}",
                    deadline=deadline,
                )
                files.append(FileEntry(relative, len(data), hashlib.sha256(data).hexdigest()))
            manifest = ckpt.encode_manifest(
                name=name,
                sequence=sequence,
                step=step,
                metrics=ckpt.check_metrics({**(metrics or {}), "commits": step}),
                created_at=time.time(),
                files=files,
            )
            store._retry(
                lambda left: store.client.write_bytes(store._manifest_uri(name), manifest, timeout_s=left),
                f"committing {store.location.display_join(name)}",
                deadline=deadline,
            )
        except StaleCheckpointError:
            raise
        except BaseException as error:
            if not isinstance(error, TimeoutError):
                store._failed_uploads.add(name)
            raise
        store._collector.clear_pending(name)
        checkpoint = ckpt.decode_manifest(manifest, store.location.display_join(name))
        with store._manifest_lock:
            store._manifests[name] = checkpoint
        logger.info("Committed %s (%d parts, %d bytes).", checkpoint.uri, len(parts), checkpoint.total_bytes)
        store._collect_garbage(sequence)
        return checkpoint

    # -- reading ----------------------------------------------------------------------------------------------

    def latest(self) -> str | None:
        checkpoint = self.store.latest()
        return None if checkpoint is None else checkpoint.name

    def download(self, name: str, local_dir: str | os.PathLike[str], *, parts: Iterable[str] | None = None) -> int:
        """Download checkpoint ``name`` into ``local_dir``, verified against its manifest; its commit count.

        Whole by default (``local_dir`` new or empty). With ``parts``, only the files at its top (a format's
        index, such as DCP's ``.metadata``) and those parts: a reader that needs some ranks' parts reads the
        index first (``parts=()``), then adds the parts it needs into the same folder.
        """
        if parts is None:
            return _commits(self.store.restore(name, local_dir=local_dir))
        store = self.store
        checkpoint = next((c for c in store.list() if c.name == name), None)
        if checkpoint is None:
            raise CheckpointNotFoundError(f"No committed checkpoint {name!r} under {store.location.display}.")
        wanted = sorted(set(parts))
        for part in wanted:
            if not part or "/" in part or part.startswith("."):
                raise ValueError(f"A part is a plain folder name, got {part!r}.")
        target = Path(local_dir)
        target.mkdir(parents=True, exist_ok=True)
        top = [e for e in checkpoint.files if "/" not in e.path and not (target / e.path).exists()]
        files = top + [e for e in checkpoint.files if e.path.split("/", 1)[0] in wanted]
        with store._readers.reading(name, lease_s=store.timeout_s + _LEASE_MARGIN_S):
            if store._read_manifest(name) is None:  # collected just before the lease: nothing to read any more
                raise CheckpointNotFoundError(f"{checkpoint.uri} was collected before it could be read.")
            deadline = time.monotonic() + store.timeout_s
            for part in wanted:
                if (target / part).exists():
                    raise FileExistsError(f"Part {part} of {checkpoint.uri} is in {str(target)!r} already.")
                (target / part).mkdir()
                store._retry(
                    lambda left, part=part: store.client.download(
                        store.location.join(name, part), str(target / part), timeout_s=left
                    ),
                    f"downloading {part} of {checkpoint.uri}",
                    deadline=deadline,
                )
            for entry in top:
                data = store._retry(
                    lambda left, entry=entry: store.client.read_bytes(
                        store.location.join(name, entry.path), timeout_s=left
                    ),
                    f"downloading {entry.path} of {checkpoint.uri}",
                    deadline=deadline,
                )
                (target / entry.path).write_bytes(data)
        verify_files(target, checkpoint, files)
        return _commits(checkpoint)

    def flush(self, timeout: float | None = None) -> None:
        """Parts upload in the executor's background thread, which the executor waits for itself when the job's
        function returns; takes ``timeout`` as ``StatePersistence.flush`` does, so either kind can be flushed."""

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
