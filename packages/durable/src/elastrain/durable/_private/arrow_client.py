"""A client on pyarrow's S3 filesystem: bytes move in C++ threads, outside the GIL.

s3fs moves bytes in Python (aiobotocore on an asyncio loop), so in a process that imports torch or trains while a
checkpoint moves, the two take turns on one interpreter lock. pyarrow's filesystems (what Ray Train and Tune
persist through) do their requests in C++ and release the lock; importing them costs nothing where Ray's
libraries already did. Checksums are still taken from the very bytes that move: each file is read here in
chunks, hashed (hashlib releases the lock on large buffers) and handed to pyarrow's stream.

Deadlines: every operation runs in daemon threads that the caller stops waiting for at its deadline (the
filesystem's own ``request_timeout``/``connect_timeout`` bound each request); a thread that wakes up later
stops before its next chunk and never opens another file.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from elastrain.durable._private import local_transfer as local
from elastrain.durable._private.checkpoint import FileEntry
from elastrain.durable._private.errors import StorageError, StorageTimeoutError
from elastrain.durable._private.files import download_targets, walk_files
from elastrain.durable._private.sync_client import DescribedTransfers

T = TypeVar("T")
_MIB = 1 << 20
# GCS is left out for now: fake-gcs-server answers pyarrow's folder listings with nothing, so it is untested.
_OBJECT_STORES = ("s3",)


def _pyarrow_fs() -> Any:
    try:
        import pyarrow.fs
    except ImportError as error:
        raise ImportError("ArrowSyncClient needs pyarrow: pip install 'elastrain-durable[arrow]'") from error
    return pyarrow.fs


class ArrowSyncClient(DescribedTransfers):
    """Moves checkpoints with pyarrow's ``pyarrow.fs.S3FileSystem`` (S3 and S3-compatible servers).

    ``CheckpointStore("s3://bucket/run", sync_client=ArrowSyncClient(pyarrow.fs.S3FileSystem(region="...")))``.
    ``max_concurrency`` files move at once, each in ``chunk_size`` reads. Memory held: ``max_concurrency`` chunks
    here, plus the parts pyarrow's S3 streams upload in the background (``background_writes=False`` on the
    filesystem holds at most one part per file, for a bound of about ``max_concurrency`` x (``chunk_size`` + 10 MiB)).
    """

    def __init__(self, filesystem: Any, *, max_concurrency: int = 8, chunk_size: int = 2 * _MIB) -> None:
        fs = _pyarrow_fs()
        if not isinstance(filesystem, fs.FileSystem):
            raise TypeError(
                "ArrowSyncClient takes a pyarrow filesystem such as pyarrow.fs.S3FileSystem(...), got "
                f"{type(filesystem).__name__}; for fsspec filesystems use FsspecSyncClient."
            )
        if filesystem.type_name not in _OBJECT_STORES:
            raise ValueError(
                f"ArrowSyncClient works on S3 (pyarrow.fs.S3FileSystem), where an object appears only once whole; got "
                f"a {filesystem.type_name!r} filesystem. For GCS use the default client (storage_options); local and "
                "mounted folders need no client: give the store a path."
            )
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ValueError(f"max_concurrency must be an int of at least 1, got {max_concurrency!r}.")
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 64 << 10:
            raise ValueError(f"chunk_size must be an int of at least 65536 bytes, got {chunk_size!r}.")
        self.filesystem = filesystem
        self.max_concurrency = max_concurrency
        self.chunk_size = chunk_size

    def __repr__(self) -> str:
        return f"ArrowSyncClient({self.filesystem.type_name})"

    def __reduce__(self) -> tuple[Any, ...]:  # pyarrow filesystems pickle: the client ships to Ray workers
        return (
            type(self),
            (self.filesystem,),
            {"max_concurrency": self.max_concurrency, "chunk_size": self.chunk_size},
        )

    # -- folder operations --------------------------------------------------------------------------------------

    def upload(self, local_dir: str, uri: str, *, timeout_s: float) -> None:
        self._upload_described(local_dir, uri, timeout_s=timeout_s)

    def _upload_described(self, local_dir: str, uri: str, *, timeout_s: float) -> list[FileEntry]:
        base = _path(uri)
        pairs = walk_files(local_dir)

        def send(gave_up: threading.Event) -> list[FileEntry]:
            sent = self._map(lambda pair: self._upload_file(pair[0], f"{base}/{pair[1]}", gave_up), pairs, gave_up)
            return [
                FileEntry(relative, size, digest) for (_, relative), (size, digest) in zip(pairs, sent, strict=True)
            ]

        return self._run(send, timeout_s, f"uploading to {uri}")

    def download(self, uri: str, local_dir: str, *, timeout_s: float) -> None:
        self._download_described(uri, local_dir, timeout_s=timeout_s)

    def _download_described(self, uri: str, local_dir: str, *, timeout_s: float) -> list[FileEntry]:
        base = _path(uri)

        def fetch(gave_up: threading.Event) -> list[FileEntry]:
            found = self._files_under(base)
            targets = download_targets(base, found, local_dir)
            described = self._map(lambda pair: self._download_file(pair[0], pair[1], gave_up), targets, gave_up)
            return [
                FileEntry(path[len(base) + 1 :], size, digest)
                for (path, _), (size, digest) in zip(targets, described, strict=True)
            ]

        return self._run(fetch, timeout_s, f"downloading {uri}")

    def delete(self, uri: str, *, timeout_s: float) -> None:
        base = _path(uri)

        def remove(gave_up: threading.Event) -> None:
            fs = _pyarrow_fs()
            info = self.filesystem.get_file_info(base)
            if info.type == fs.FileType.File:
                self.filesystem.delete_file(base)
                return
            if info.type != fs.FileType.Directory:
                return
            # Deepest folder first: servers with real folders (SeaweedFS) keep an emptied subfolder, and then
            # refuse to delete the folder above it.
            selector = fs.FileSelector(base, recursive=True, allow_not_found=True)
            found = self.filesystem.get_file_info(selector)
            folders = sorted({i.path for i in found if i.type == fs.FileType.Directory}, key=len, reverse=True)
            for folder in [*folders, base]:
                if gave_up.is_set():
                    raise StorageTimeoutError("abandoned at its deadline")
                with contextlib.suppress(FileNotFoundError):  # gone with its parent's listing meanwhile
                    self.filesystem.delete_dir(folder)
            if self.filesystem.get_file_info(base).type != fs.FileType.NotFound:
                raise StorageError(f"{uri} is still there after deleting everything under it.")

        self._run(remove, timeout_s, f"deleting {uri}")

    # -- small files --------------------------------------------------------------------------------------------

    def list_names(self, uri: str, *, timeout_s: float) -> list[str]:
        base = _path(uri)

        def listing(gave_up: threading.Event) -> list[str]:
            fs = _pyarrow_fs()
            selector = fs.FileSelector(base, allow_not_found=True)
            return sorted({info.base_name for info in self.filesystem.get_file_info(selector)})

        return self._run(listing, timeout_s, f"listing {uri}")

    def read_bytes(self, uri: str, *, timeout_s: float) -> bytes:
        return self._run(lambda gave_up: self._read(_path(uri)), timeout_s, f"reading {uri}")

    def read_many(self, uris: list[str], *, timeout_s: float) -> dict[str, bytes | None]:
        """Several small files at once (``max_concurrency`` in flight)."""

        def one(uri: str) -> bytes | None:
            try:
                return self._read(_path(uri))
            except FileNotFoundError:
                return None

        found = self._run(lambda gave_up: self._map(one, uris, gave_up), timeout_s, f"reading {len(uris)} files")
        return dict(zip(uris, found, strict=True))

    def write_bytes(self, uri: str, data: bytes, *, timeout_s: float) -> None:
        path = _path(uri)

        def write(gave_up: threading.Event) -> None:
            # One request at close (a small object is one PUT): readers see nothing or everything.
            with self.filesystem.open_output_stream(path, metadata={}) as out:
                out.write(data)

        self._run(write, timeout_s, f"writing {uri}")

    # -- transfers ------------------------------------------------------------------------------------------------

    def _upload_file(self, source: str, path: str, gave_up: threading.Event) -> tuple[int, str]:
        digest = hashlib.sha256()
        size = 0
        buffer = bytearray(self.chunk_size)
        view = memoryview(buffer)
        with open(source, "rb", buffering=0) as reader, self.filesystem.open_output_stream(path, metadata={}) as out:
            while count := reader.readinto(buffer):
                if gave_up.is_set():
                    raise StorageTimeoutError("abandoned at its deadline")
                chunk = view[:count]
                digest.update(chunk)
                out.write(chunk)  # copied into pyarrow's part buffer: the next readinto may reuse ours
                size += count
        return size, digest.hexdigest()

    def _download_file(self, path: str, target: str, gave_up: threading.Event) -> tuple[int, str]:
        digest = hashlib.sha256()
        size = 0
        with self.filesystem.open_input_stream(path) as stream, open(target, "wb") as writer:
            while True:
                if gave_up.is_set():
                    raise StorageTimeoutError("abandoned at its deadline")
                chunk = memoryview(stream.read_buffer(self.chunk_size))
                if not chunk:
                    break
                digest.update(chunk)
                writer.write(chunk)
                size += len(chunk)
        return size, digest.hexdigest()

    def _files_under(self, base: str) -> list[str]:
        fs = _pyarrow_fs()
        selector = fs.FileSelector(base, recursive=True, allow_not_found=True)
        return sorted(info.path for info in self.filesystem.get_file_info(selector) if info.type == fs.FileType.File)

    def _read(self, path: str) -> bytes:
        with self.filesystem.open_input_stream(path) as stream:
            data: bytes = stream.read()
        return data

    def _map(self, fn: Callable[[Any], T], items: list[Any], gave_up: threading.Event) -> list[T]:
        # Daemon threads, all stopped before an error is raised: a retry never races the attempt before it.
        return local.map_daemon(fn, items, gave_up, max_threads=self.max_concurrency)

    def _run(self, fn: Callable[[threading.Event], T], timeout_s: float, what: str) -> T:
        gave_up = threading.Event()
        return local.run_with_deadline(lambda: fn(gave_up), timeout_s, what, gave_up)


def _path(uri: str) -> str:
    """``s3://bucket/key`` -> ``bucket/key``, as pyarrow's object-store filesystems name objects."""
    scheme, separator, rest = uri.partition("://")
    return (rest if separator else scheme).rstrip("/")
