"""The default client: fsspec for object stores and other filesystems, plain OS calls for local folders.

Deadlines are real: for async filesystems (s3fs, gcsfs) each transfer is an ``asyncio`` task on fsspec's loop
that is cancelled when the deadline passes (an S3 PUT to a server that stops answering otherwise hangs forever);
local and mounted folders run each call in a daemon thread that is abandoned at the deadline (a hung NFS mount).
Local writes go to a temporary name, are fsynced and renamed, because readers can see a file being written.
On the local disk and on S3, checksums are taken from the bytes as they move (``_upload_described``,
``_download_described``), so a file changed during an upload cannot commit a manifest that does not match.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from elastrain.durable._private import local_transfer as local
from elastrain.durable._private.checkpoint import FileEntry
from elastrain.durable._private.errors import StorageError, StorageTimeoutError
from elastrain.durable._private.files import download_targets, walk_files
from elastrain.durable._private.s3_transfer import MIN_PART_SIZE, S3Transfer, gather_bounded, is_s3
from elastrain.durable._private.sync_client import DescribedTransfers

T = TypeVar("T")
_MIB = 1 << 20


class FsspecSyncClient(DescribedTransfers):
    """Moves checkpoints with an fsspec filesystem (``filesystem=None``: the local disk).

    ``max_concurrency`` files move at once on async filesystems. On S3, files of ``2 * part_size`` bytes or
    more move in parts of ``part_size``, several at once; ``max_bytes_in_flight`` bounds the memory that parts
    in flight hold, for one upload or download as a whole.
    """

    def __init__(
        self,
        filesystem: Any = None,
        *,
        max_concurrency: int = 8,
        part_size: int = 16 * _MIB,
        max_bytes_in_flight: int = 256 * _MIB,
    ) -> None:
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ValueError(f"max_concurrency must be an int of at least 1, got {max_concurrency!r}.")
        if isinstance(part_size, bool) or not isinstance(part_size, int) or part_size < MIN_PART_SIZE:
            raise ValueError(
                f"part_size must be an int of at least {MIN_PART_SIZE} bytes (5 MiB, S3's smallest part), "
                f"got {part_size!r}."
            )
        if isinstance(max_bytes_in_flight, bool) or not isinstance(max_bytes_in_flight, int):
            raise ValueError(f"max_bytes_in_flight must be an int, got {max_bytes_in_flight!r}.")
        if max_bytes_in_flight < part_size:
            raise ValueError(
                f"max_bytes_in_flight ({max_bytes_in_flight}) must hold at least one part of part_size "
                f"({part_size}) bytes; raise it or lower part_size."
            )
        self.filesystem = filesystem
        self.max_concurrency = max_concurrency
        self.part_size = part_size
        self.max_bytes_in_flight = max_bytes_in_flight

    def __repr__(self) -> str:
        kind = "local" if self.filesystem is None else type(self.filesystem).__name__
        return f"FsspecSyncClient({kind})"

    # -- folder operations --------------------------------------------------------------------------------------

    def upload(self, local_dir: str, uri: str, *, timeout_s: float) -> None:
        if self._upload_described(local_dir, uri, timeout_s=timeout_s) is not None:
            return
        pairs = walk_files(local_dir)
        fs = self.filesystem
        base = fs._strip_protocol(uri)
        if self._is_async:
            self._run_async(
                lambda: gather_bounded(
                    [functools.partial(fs._put_file, src, f"{base}/{rel}") for src, rel in pairs], self.max_concurrency
                ),
                timeout_s,
                f"uploading to {uri}",
            )
        else:
            local.run_with_deadline(
                lambda: [fs.put_file(src, f"{base}/{rel}") for src, rel in pairs], timeout_s, f"uploading to {uri}"
            )

    def _upload_described(self, local_dir: str, uri: str, *, timeout_s: float) -> list[FileEntry] | None:
        """Upload and describe the bytes sent; None (nothing done) where this filesystem cannot tell them."""
        if self.filesystem is None:
            target = _local(uri)
            gave_up = threading.Event()
            return local.run_with_deadline(
                lambda: local.copy_tree(local_dir, target, gave_up), timeout_s, f"copying to {uri}", gave_up
            )
        if not is_s3(self.filesystem):
            return None
        base = self.filesystem._strip_protocol(uri).rstrip("/")
        pairs = walk_files(local_dir)
        entries: list[FileEntry] = self._run_async(
            lambda: self._s3().upload_tree(pairs, base), timeout_s, f"uploading to {uri}"
        )
        return entries

    def download(self, uri: str, local_dir: str, *, timeout_s: float) -> None:
        if self._download_described(uri, local_dir, timeout_s=timeout_s) is not None:
            return
        fs = self.filesystem
        base = fs._strip_protocol(uri).rstrip("/")
        if self._is_async:

            async def fetch() -> None:
                fs.invalidate_cache(base)
                found = await fs._find(base)
                calls: list[Callable[[], Coroutine[Any, Any, Any]]] = [
                    functools.partial(fs._get_file, src, dst) for src, dst in download_targets(base, found, local_dir)
                ]
                await gather_bounded(calls, self.max_concurrency)

            self._run_async(fetch, timeout_s, f"downloading {uri}")
        else:

            def fetch_blocking() -> None:
                fs.invalidate_cache(base)
                for src, dst in download_targets(base, fs.find(base), local_dir):
                    fs.get_file(src, dst)

            local.run_with_deadline(fetch_blocking, timeout_s, f"downloading {uri}")

    def _download_described(self, uri: str, local_dir: str, *, timeout_s: float) -> list[FileEntry] | None:
        """Download and describe the bytes received; None (nothing done) where this filesystem cannot tell them."""
        if self.filesystem is None:
            source = _local(uri)
            gave_up = threading.Event()

            def copy() -> list[FileEntry]:
                return local.copy_tree(source, local_dir, gave_up) if os.path.isdir(source) else []

            return local.run_with_deadline(copy, timeout_s, f"copying {uri}", gave_up)
        if not is_s3(self.filesystem):
            return None
        fs = self.filesystem
        base = fs._strip_protocol(uri).rstrip("/")

        async def fetch() -> list[FileEntry]:
            fs.invalidate_cache(base)
            found = await fs._find(base, detail=True)
            targets = download_targets(base, list(found), local_dir)
            files = [(path, int(found[path]["size"]), target) for path, target in targets]
            described = await self._s3().download_tree(files)
            return [
                FileEntry(path[len(base) + 1 :], size, digest)
                for (path, _, _), (size, digest) in zip(files, described, strict=True)
            ]

        entries: list[FileEntry] = self._run_async(fetch, timeout_s, f"downloading {uri}")
        return entries

    def delete(self, uri: str, *, timeout_s: float) -> None:
        if self.filesystem is None:
            path = _local(uri)
            local.run_with_deadline(lambda: local.remove(path), timeout_s, f"deleting {uri}")
            return
        fs = self.filesystem
        base = fs._strip_protocol(uri).rstrip("/")
        if self._is_async:

            async def remove() -> None:
                fs.invalidate_cache(base)
                found = await fs._find(base, withdirs=False)
                if found:
                    await fs._rm(found)
                # Even with no file under it: an emptied folder (a delete cut short) still lists on SeaweedFS.
                await _remove_folder_entries(fs, base, found)
                fs.invalidate_cache(base)

            self._run_async(remove, timeout_s, f"deleting {uri}")
        else:

            def remove_blocking() -> None:
                if fs.exists(base):
                    fs.rm(base, recursive=True)
                fs.invalidate_cache(base)

            local.run_with_deadline(remove_blocking, timeout_s, f"deleting {uri}")

    def delete_file(self, uri: str, *, timeout_s: float) -> None:
        """One request on object stores, where :meth:`delete` lists the prefix and removes folder entries too."""
        fs = self.filesystem
        if fs is None:
            self.delete(uri, timeout_s=timeout_s)
            return
        path = fs._strip_protocol(uri)
        if self._is_async:

            async def remove() -> None:
                with contextlib.suppress(FileNotFoundError):
                    await fs._rm_file(path)
                fs.invalidate_cache(path)

            try:
                self._run_async(remove, timeout_s, f"deleting {uri}")
            except NotImplementedError:  # a filesystem without single-file removal
                self.delete(uri, timeout_s=timeout_s)
        else:

            def remove_blocking() -> None:
                with contextlib.suppress(FileNotFoundError):
                    fs.rm_file(path)
                fs.invalidate_cache(path)

            try:
                local.run_with_deadline(remove_blocking, timeout_s, f"deleting {uri}")
            except NotImplementedError:
                self.delete(uri, timeout_s=timeout_s)

    def _abort_open_uploads(self, uri: str, *, timeout_s: float) -> None:
        """S3 only: abort multipart uploads left open under a deleted checkpoint folder (a writer killed
        mid-upload, or an abort that failed); elsewhere nothing. Needs s3:ListBucketMultipartUploads."""
        if not is_s3(self.filesystem):
            return
        base = self.filesystem._strip_protocol(uri).rstrip("/")
        self._run_async(lambda: self._s3().abort_open_uploads(base), timeout_s, f"aborting uploads under {uri}")

    # -- small files --------------------------------------------------------------------------------------------

    def list_names(self, uri: str, *, timeout_s: float) -> list[str]:
        if self.filesystem is None:
            path = _local(uri)
            return local.run_with_deadline(
                lambda: sorted(os.listdir(path)) if os.path.isdir(path) else [], timeout_s, f"listing {uri}"
            )
        fs = self.filesystem
        base = fs._strip_protocol(uri).rstrip("/")

        def names(entries: list[str]) -> list[str]:
            return sorted({entry.rstrip("/").rsplit("/", 1)[-1] for entry in entries if entry.rstrip("/") != base})

        if self._is_async:

            async def listing() -> list[str]:
                fs.invalidate_cache(base)
                try:
                    return names(await fs._ls(base, detail=False))
                except FileNotFoundError:
                    return []

            return self._run_async(listing, timeout_s, f"listing {uri}")

        def listing_blocking() -> list[str]:
            fs.invalidate_cache(base)
            return names(fs.ls(base, detail=False)) if fs.exists(base) else []

        return local.run_with_deadline(listing_blocking, timeout_s, f"listing {uri}")

    def read_bytes(self, uri: str, *, timeout_s: float) -> bytes:
        if self.filesystem is None:
            return local.run_with_deadline(lambda: _read_local(_local(uri)), timeout_s, f"reading {uri}")
        fs = self.filesystem
        path = fs._strip_protocol(uri)
        if self._is_async:
            data: bytes = self._run_async(lambda: fs._cat_file(path), timeout_s, f"reading {uri}")
            return data
        return bytes(local.run_with_deadline(lambda: fs.cat_file(path), timeout_s, f"reading {uri}"))

    def read_many(self, uris: list[str], *, timeout_s: float) -> dict[str, bytes | None]:
        """Several small files at once (``max_concurrency`` in flight on async filesystems)."""
        if not self._is_async:
            return super().read_many(uris, timeout_s=timeout_s)
        fs = self.filesystem

        async def one(uri: str) -> bytes | None:
            try:
                data: bytes = await fs._cat_file(fs._strip_protocol(uri))
                return data
            except FileNotFoundError:
                return None

        async def all_of_them() -> list[bytes | None]:
            return await gather_bounded([functools.partial(one, uri) for uri in uris], self.max_concurrency)

        found: list[bytes | None] = self._run_async(all_of_them, timeout_s, f"reading {len(uris)} files")
        return dict(zip(uris, found, strict=True))

    def write_bytes(self, uri: str, data: bytes, *, timeout_s: float) -> None:
        if self.filesystem is None:
            gave_up = threading.Event()
            local.run_with_deadline(
                lambda: local.durable_write(_local(uri), data, gave_up), timeout_s, f"writing {uri}", gave_up
            )
            return
        fs = self.filesystem
        path = fs._strip_protocol(uri)
        # Object stores show an object only once its PUT completes, so a plain write is already all-or-nothing.
        if self._is_async:
            self._run_async(lambda: fs._pipe_file(path, data), timeout_s, f"writing {uri}")
        else:
            local.run_with_deadline(lambda: fs.pipe_file(path, data), timeout_s, f"writing {uri}")

    # -- deadlines ----------------------------------------------------------------------------------------------

    @property
    def _is_async(self) -> bool:
        return bool(getattr(self.filesystem, "async_impl", False))

    def _s3(self) -> S3Transfer:
        return S3Transfer(
            self.filesystem,
            part_size=self.part_size,
            max_bytes_in_flight=self.max_bytes_in_flight,
            max_concurrency=self.max_concurrency,
        )

    def _run_async(self, make: Callable[[], Awaitable[T]], timeout_s: float, what: str) -> T:
        from fsspec.asyn import sync

        # Errors come out in a box: fsspec's sync() turns any TimeoutError (ours too) into its own.
        failed: list[BaseException] = []

        async def bounded() -> T | None:
            deadline = asyncio.timeout(max(timeout_s, 0.001))
            try:
                async with deadline:
                    return await make()
            except TimeoutError as error:
                failed.append(error if not deadline.expired() else _DEADLINE)
                return None

        result = sync(self.filesystem.loop, bounded)
        if failed and failed[0] is _DEADLINE:
            raise StorageTimeoutError(f"Gave up {what} after its deadline of {timeout_s:.1f} s.")
        if failed:  # a timeout of the connection itself (aiohttp's), well within the deadline: retried
            raise StorageError(f"{what}: {type(failed[0]).__name__}: {failed[0]}") from failed[0]
        return result  # type: ignore[no-any-return]


_DEADLINE = TimeoutError("the deadline passed")


async def _remove_folder_entries(fs: Any, base: str, files: list[str]) -> None:
    """S3 servers with real folders (SeaweedFS) keep a deleted prefix as an empty folder until its ``key/`` is
    deleted, deepest first; on plain object stores these deletes are no-ops."""
    if not is_s3(fs):
        return
    folders = {base}
    for path in files:
        parent = path.rsplit("/", 1)[0]
        while len(parent) > len(base):
            folders.add(parent)
            parent = parent.rsplit("/", 1)[0]
    for folder in sorted(folders, key=len, reverse=True):
        bucket, _, key = folder.partition("/")
        if key:
            await fs._call_s3("delete_object", Bucket=bucket, Key=key + "/")


def _local(uri: str) -> str:
    for prefix in ("file://", "local://"):
        if uri.startswith(prefix):
            return uri[len(prefix) :]
    return uri


def _read_local(path: str) -> bytes:
    with open(path, "rb") as reader:
        return reader.read()
