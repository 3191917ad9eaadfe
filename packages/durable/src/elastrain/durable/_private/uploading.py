"""A save's upload, and the checksums its manifest records: always of the bytes that were uploaded."""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path
from typing import TYPE_CHECKING

from elastrain.durable._private.checkpoint import FileEntry
from elastrain.durable._private.staging import StagingMode, check_unchanged, describe, stamps
from elastrain.durable._private.sync_client import transfers_described

if TYPE_CHECKING:
    from elastrain.durable._private.store import CheckpointStore


def upload_described(
    store: CheckpointStore, staged: Path, name: str, staging: StagingMode | None, deadline: float
) -> list[FileEntry]:
    """Upload ``staged`` under ``name``; the entries returned (the manifest's) describe the bytes uploaded."""
    data_uri = store.location.join(name)
    what = f"uploading {store.location.display_join(name)}"
    private_copy = staging in ("copy", "move")
    before = None if private_copy else stamps(staged)  # files the caller may still rewrite
    client = store.client
    if transfers_described(client, "upload"):
        # Checksums of the bytes as they are sent: the manifest always matches what was uploaded, and the
        # check after it catches a file rewritten meanwhile (committing a mix of old and new bytes).
        described = store._retry(
            lambda left: client._upload_described(str(staged), data_uri, timeout_s=left), what, deadline=deadline
        )
        if described is not None:
            if before is not None:
                check_unchanged(staged, before)
            return list(described)
    # Other clients read the files themselves: checksum first and check afterwards that nothing changed
    # where the files are not a private copy; otherwise checksum while uploading (both read the same pages).
    if before is not None:
        files = describe(staged)
        store._retry(lambda left: store.client.upload(str(staged), data_uri, timeout_s=left), what, deadline=deadline)
        check_unchanged(staged, before)
        return files
    hashing = store._hashing.submit(describe, staged)
    try:
        store._retry(lambda left: store.client.upload(str(staged), data_uri, timeout_s=left), what, deadline=deadline)
        return hashing.result(timeout=max(deadline - time.monotonic(), 0.001))
    finally:
        concurrent.futures.wait([hashing], timeout=max(deadline - time.monotonic(), 0.001))
