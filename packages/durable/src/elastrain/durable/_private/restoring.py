"""Restores: the latest (or a named) checkpoint into a local folder, verified, with fallbacks and reader leases."""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from elastrain.durable._private import checkpoint as ckpt
from elastrain.durable._private.checkpoint import Checkpoint
from elastrain.durable._private.errors import CheckpointCorruptedError, CheckpointNotFoundError, StorageError
from elastrain.durable._private.staging import verify_folder
from elastrain.durable._private.sync_client import transfers_described

if TYPE_CHECKING:
    from elastrain.durable._private.store import CheckpointStore

logger = logging.getLogger("elastrain.durable")

# A restore's lease outlives its deadline by this much (clock differences between machines).
_LEASE_MARGIN_S = 300.0
# restore() of the latest checkpoint looks again this often when collection takes the one it chose.
_LATEST_ATTEMPTS = 3


class _CollectedWhileRestoringError(CheckpointNotFoundError):
    """The checkpoint being restored was collected meanwhile (only possible without a reader lease)."""


def restore(store: CheckpointStore, checkpoint: Checkpoint | str | None, target: Path, fallback: bool) -> Checkpoint:
    """``CheckpointStore.restore``: the chosen checkpoint, or with ``fallback`` the next older intact one; the
    latest again (a few times) when collection takes the one chosen while it is read without a lease."""
    for attempt in range(_LATEST_ATTEMPTS):
        try:
            return restore_first(store, restore_candidates(store, checkpoint, fallback), target)
        except _CollectedWhileRestoringError as error:
            if checkpoint is not None or attempt + 1 == _LATEST_ATTEMPTS:
                raise
            logger.warning("%s; restoring the latest checkpoint now.", error)
    raise AssertionError("unreachable")  # pragma: no cover


def restore_first(store: CheckpointStore, candidates: list[Checkpoint], target: Path) -> Checkpoint:
    """Restore the first candidate that is intact; the next ones are fallbacks for a corrupted one."""
    for index, candidate in enumerate(candidates):
        try:
            with store._readers.reading(candidate.name, lease_s=store.timeout_s + _LEASE_MARGIN_S) as lease:
                # Look again now that the lease is there: collection may have taken it just before.
                if store._read_manifest(candidate.name) is None:
                    raise _CollectedWhileRestoringError(
                        f"{candidate.uri} was collected while the restore began; committed now: "
                        f"{', '.join(c.name for c in store.list()) or 'none'}."
                    )
                try:
                    restore_one(store, candidate, target)
                except (CheckpointCorruptedError, FileNotFoundError, StorageError) as error:
                    # Without a lease, collection may delete the files mid-download: say so, not "corrupted".
                    if lease.held or store._read_manifest(candidate.name) is not None:
                        raise
                    raise _CollectedWhileRestoringError(
                        f"{candidate.uri} was collected while it was being restored without a reader lease "
                        f"({lease.problem}); the files read were discarded ({type(error).__name__})."
                    ) from None
            return candidate
        except _CollectedWhileRestoringError:
            raise  # restore() looks for the new latest; an older one is no substitute
        except CheckpointNotFoundError:
            if index + 1 == len(candidates):
                raise
        except CheckpointCorruptedError as error:
            if index + 1 == len(candidates):
                raise
            logger.warning("%s; falling back to the previous checkpoint.", error)
            uncommit_corrupted(store, candidate)
    raise AssertionError("unreachable")  # pragma: no cover


def uncommit_corrupted(store: CheckpointStore, checkpoint: Checkpoint) -> None:
    """Take a corrupted checkpoint out of the order (its files go with the next collection): left committed,
    it would stay latest(), and its step would refuse the saves of whoever resumed from an older one."""
    try:
        store._retry(
            lambda left: store.client.delete(store.location.join(ckpt.MANIFEST_DIR, checkpoint.name), timeout_s=left),
            f"uncommitting the corrupted {checkpoint.uri}",
        )
        store._collector.mark_abandoned(checkpoint.name)
        with store._manifest_lock:
            store._manifests.pop(checkpoint.name, None)
    except Exception as error:  # read-only credentials: it stays, and saves below its step are refused
        logger.warning("Could not uncommit the corrupted %s (%s).", checkpoint.uri, store._redact(str(error)))


def restore_candidates(store: CheckpointStore, checkpoint: Checkpoint | str | None, fallback: bool) -> list[Checkpoint]:
    committed = store.list()
    if not committed:
        raise CheckpointNotFoundError(f"No committed checkpoint under {store.location.display}.")
    if checkpoint is None:
        chosen = committed[-1]
    else:
        name = checkpoint.name if isinstance(checkpoint, Checkpoint) else str(checkpoint)
        matches = [c for c in committed if c.name == name]
        if not matches:
            raise CheckpointNotFoundError(
                f"No committed checkpoint {name!r} under {store.location.display} (it may have been collected); "
                f"committed: {', '.join(c.name for c in committed)}."
            )
        chosen = matches[0]
    if not fallback:
        return [chosen]
    return [chosen] + [c for c in reversed(committed) if ckpt.order_key(c) < ckpt.order_key(chosen)]


def restore_one(store: CheckpointStore, checkpoint: Checkpoint, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.parent / f".{target.name}.restoring-{uuid.uuid4().hex[:8]}"
    scratch.mkdir()
    try:
        data_uri = store.location.join(checkpoint.name)
        what = f"downloading {checkpoint.uri}"
        observed = None
        client = store.client
        if transfers_described(client, "download"):  # checksums while the bytes arrive: no second read
            observed = store._retry(
                lambda left: client._download_described(data_uri, str(scratch), timeout_s=left), what
            )
        if observed is None:
            store._retry(lambda left: store.client.download(data_uri, str(scratch), timeout_s=left), what)
        verify_folder(scratch, checkpoint, observed)
        if target.exists():
            target.rmdir()
        os.replace(scratch, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
