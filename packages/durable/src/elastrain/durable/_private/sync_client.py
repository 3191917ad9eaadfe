"""The interface a store moves bytes through. Everything (uploads, manifests, deletes) goes through one client."""

from __future__ import annotations

import os
import posixpath
import tempfile
import time
from abc import ABC, abstractmethod
from typing import TypeGuard

from elastrain.durable._private.checkpoint import FileEntry
from elastrain.durable._private.errors import StorageTimeoutError


class SyncClient(ABC):
    """Moves folders between this machine and storage. Subclasses implement three folder operations.

    URIs are in the style the store was given (``s3://bucket/run/checkpoint_...`` or a plain path). Each
    operation gets ``timeout_s``, the time left of its overall deadline: a client must not run past it (raise
    ``StorageTimeoutError``). Operations must be idempotent: the store retries them.
    """

    @abstractmethod
    def upload(self, local_dir: str, uri: str, *, timeout_s: float) -> None:
        """Copy every file under ``local_dir`` to the same relative path under ``uri``."""

    @abstractmethod
    def download(self, uri: str, local_dir: str, *, timeout_s: float) -> None:
        """Copy every file under ``uri`` to the same relative path under ``local_dir`` (an existing, empty folder).

        A ``uri`` with nothing under it leaves ``local_dir`` empty.
        """

    @abstractmethod
    def delete(self, uri: str, *, timeout_s: float) -> None:
        """Remove ``uri`` and everything under it; nothing there is not an error."""

    # The store also lists, reads and writes small files (manifests). These defaults use the folder operations
    # above; clients with cheaper ways override them.

    def list_names(self, uri: str, *, timeout_s: float) -> list[str]:
        """The names directly under ``uri`` (files and folders); none when it does not exist."""
        with tempfile.TemporaryDirectory(prefix="elastrain-list-") as scratch:
            self.download(uri, scratch, timeout_s=timeout_s)
            return sorted(os.listdir(scratch))

    def read_bytes(self, uri: str, *, timeout_s: float) -> bytes:
        """The content of the file ``uri``; FileNotFoundError when absent."""
        parent, name = _split(uri)
        with tempfile.TemporaryDirectory(prefix="elastrain-read-") as scratch:
            self.download(parent, scratch, timeout_s=timeout_s)
            path = os.path.join(scratch, name)
            if not os.path.isfile(path):
                raise FileNotFoundError(uri)
            with open(path, "rb") as reader:
                return reader.read()

    def read_many(self, uris: list[str], *, timeout_s: float) -> dict[str, bytes | None]:
        """Several small files (manifests) at once: each one's content, or None where it is absent. The default
        reads them one by one within the one deadline; clients that can, read them concurrently."""
        deadline = time.monotonic() + timeout_s
        found: dict[str, bytes | None] = {}
        for uri in uris:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StorageTimeoutError(f"Gave up reading {len(uris)} files after {timeout_s:.1f} s.")
            try:
                found[uri] = self.read_bytes(uri, timeout_s=left)
            except FileNotFoundError:
                found[uri] = None
        return found

    def write_bytes(self, uri: str, data: bytes, *, timeout_s: float) -> None:
        """Write the file ``uri``. Readers must see either nothing or the whole file (manifests rely on it)."""
        parent, name = _split(uri)
        with tempfile.TemporaryDirectory(prefix="elastrain-write-") as scratch:
            with open(os.path.join(scratch, name), "wb") as writer:
                writer.write(data)
            self.upload(scratch, parent, timeout_s=timeout_s)

    def delete_file(self, uri: str, *, timeout_s: float) -> None:
        """Remove the single file ``uri`` (an upload marker, a reader lease); nothing there is not an error. The
        default is :meth:`delete`; clients that can remove one object in one request override it."""
        self.delete(uri, timeout_s=timeout_s)

    def close(self) -> None:  # noqa: B027 - optional for subclasses
        """Release connections (called by ``CheckpointStore.close``)."""


class DescribedTransfers(SyncClient):
    """The package's own clients: their upload and download take each file's size and SHA-256 from the very
    bytes they move, so the store needs no second read and a file rewritten meanwhile cannot slip through."""

    @abstractmethod
    def _upload_described(self, local_dir: str, uri: str, *, timeout_s: float) -> list[FileEntry] | None:
        """Upload and describe the bytes sent; None (nothing done) where this client cannot tell them."""

    @abstractmethod
    def _download_described(self, uri: str, local_dir: str, *, timeout_s: float) -> list[FileEntry] | None:
        """Download and describe the bytes received; None (nothing done) where this client cannot tell them."""


def transfers_described(client: SyncClient, operation: str) -> TypeGuard[DescribedTransfers]:
    """Whether ``client`` moves ``operation``'s bytes itself (a user's subclass that overrides it is used as is)."""
    method = getattr(type(client), operation)
    return isinstance(client, DescribedTransfers) and method.__module__.startswith("elastrain.durable._private.")


def _split(uri: str) -> tuple[str, str]:
    if "://" in uri:
        return posixpath.dirname(uri), posixpath.basename(uri)
    return os.path.dirname(uri), os.path.basename(uri)
