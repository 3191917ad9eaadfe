"""Errors of elastrain-durable: each says what failed and what to change."""

from __future__ import annotations


class DurableError(Exception):
    """Base class of the errors this package raises."""


class CheckpointNotFoundError(DurableError, LookupError):
    """No committed checkpoint matches (the store is empty, or the name is unknown or was collected)."""


class CheckpointCorruptedError(DurableError):
    """A checkpoint's files do not match its manifest (missing, wrong size or wrong checksum)."""


class StorageError(DurableError):
    """A transfer or delete failed after its retries."""


class StorageTimeoutError(StorageError, TimeoutError):
    """A transfer or delete did not finish within its overall deadline."""


class CommandFailedError(StorageError):
    """A ``CommandSyncClient`` command exited with a non-zero status."""


class StaleCheckpointError(DurableError):
    """A save was not committed because the store already holds a checkpoint of a later step: another writer
    (a new rank 0 after an elastic reset) has moved on. Nothing older than what is committed becomes latest."""


class FilesChangedError(DurableError):
    """Files changed while they were being uploaded (``staging="link"`` with files rewritten in place): the
    checkpoint would not match its manifest, so nothing was committed."""


# Tracebacks and reprs name a class by its __module__: the public module, not where it is implemented.
for _public in (
    DurableError,
    CheckpointNotFoundError,
    CheckpointCorruptedError,
    StorageError,
    StorageTimeoutError,
    CommandFailedError,
    StaleCheckpointError,
    FilesChangedError,
):
    _public.__module__ = "elastrain.durable"
