"""The default client: fsspec for object stores and other filesystems, plain OS calls for local folders.

Deadlines are real: for async filesystems (s3fs, gcsfs) each transfer is an ``asyncio`` task on fsspec's loop
that is cancelled when the deadline passes (an S3 PUT to a server that stops answering otherwise hangs forever).
Local writes go to a temporary name, are fsynced and renamed, because readers can see a file being written.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import threading
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from elastrain.durable._private.errors import StorageTimeoutError
from elastrain.durable._private.sync_client import SyncClient

T = TypeVar("T")


class FsspecSyncClient(SyncClient):
    """Moves checkpoints with an fsspec filesystem (``filesystem=None``: the local disk).

    ``max_concurrency`` files move at once on async filesystems.
    """

    def __init__(self, filesystem: Any = None, *, max_concurrency: int = 8) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}.")
        self.filesystem = filesystem
        self.max_concurrency = max_concurrency

    def __repr__(self) -> str:
        kind = "local" if self.filesystem is None else type(self.filesystem).__name__
        return f"FsspecSyncClient({kind})"

    # -- folder operations --------------------------------------------------------------------------------------

    def upload(self, local_dir: str, uri: str, *, timeout_s: float) -> None:
        pairs = [(os.path.join(root, name), _relative(local_dir, root, name)) for root, name in _walk(local_dir)]
        if self.filesystem is None:
            for source, relative in pairs:
                _durable_copy(source, os.path.join(_local(uri), relative))
            return
        fs = self.filesystem
        base = fs._strip_protocol(uri)
        if self._is_async:
            self._run_async(
                lambda: _bounded(
                    [functools.partial(fs._put_file, src, f"{base}/{rel}") for src, rel in pairs], self.max_concurrency
                ),
                timeout_s,
                f"uploading to {uri}",
            )
        else:
            self._run_blocking(lambda: [fs.put_file(src, f"{base}/{rel}") for src, rel in pairs], timeout_s, uri)

    def download(self, uri: str, local_dir: str, *, timeout_s: float) -> None:
        if self.filesystem is None:
            source_root = _local(uri)
            if os.path.isdir(source_root):
                for root, name in _walk(source_root):
                    _durable_copy(os.path.join(root, name), os.path.join(local_dir, _relative(source_root, root, name)))
            return
        fs = self.filesystem
        base = fs._strip_protocol(uri).rstrip("/")

        def targets(found: list[str]) -> list[tuple[str, str]]:
            pairs = []
            root = os.path.realpath(local_dir)
            for path in found:
                target = os.path.realpath(os.path.join(local_dir, *path[len(base) + 1 :].split("/")))
                if not target.startswith(root + os.sep):
                    raise ValueError(f"Refusing to download {path!r}: its key points outside the target folder.")
                os.makedirs(os.path.dirname(target), exist_ok=True)
                pairs.append((path, target))
            return pairs

        if self._is_async:

            async def fetch() -> None:
                fs.invalidate_cache(base)
                found = await fs._find(base)
                calls: list[Callable[[], Coroutine[Any, Any, Any]]] = [
                    functools.partial(fs._get_file, src, dst) for src, dst in targets(found)
                ]
                await _bounded(calls, self.max_concurrency)

            self._run_async(fetch, timeout_s, f"downloading {uri}")
        else:

            def fetch_blocking() -> None:
                fs.invalidate_cache(base)
                for src, dst in targets(fs.find(base)):
                    fs.get_file(src, dst)

            self._run_blocking(fetch_blocking, timeout_s, uri)

    def delete(self, uri: str, *, timeout_s: float) -> None:
        if self.filesystem is None:
            path = _local(uri)
            if os.path.isdir(path) and not os.path.islink(path):
                with contextlib.suppress(FileNotFoundError):
                    shutil.rmtree(path)
            elif os.path.lexists(path):
                os.remove(path)
            return
        fs = self.filesystem
        base = fs._strip_protocol(uri).rstrip("/")
        if self._is_async:

            async def remove() -> None:
                fs.invalidate_cache(base)
                found = await fs._find(base, withdirs=False)
                if found:
                    await fs._rm(found)
                    await _remove_folder_entries(fs, base, found)
                fs.invalidate_cache(base)

            self._run_async(remove, timeout_s, f"deleting {uri}")
        else:

            def remove_blocking() -> None:
                if fs.exists(base):
                    fs.rm(base, recursive=True)
                fs.invalidate_cache(base)

            self._run_blocking(remove_blocking, timeout_s, uri)

    # -- small files --------------------------------------------------------------------------------------------

    def list_names(self, uri: str, *, timeout_s: float) -> list[str]:
        if self.filesystem is None:
            path = _local(uri)
            return sorted(os.listdir(path)) if os.path.isdir(path) else []
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

        return self._run_blocking(listing_blocking, timeout_s, uri)

    def read_bytes(self, uri: str, *, timeout_s: float) -> bytes:
        if self.filesystem is None:
            with open(_local(uri), "rb") as reader:
                return reader.read()
        fs = self.filesystem
        path = fs._strip_protocol(uri)
        if self._is_async:
            data: bytes = self._run_async(lambda: fs._cat_file(path), timeout_s, f"reading {uri}")
            return data
        return bytes(self._run_blocking(lambda: fs.cat_file(path), timeout_s, uri))

    def write_bytes(self, uri: str, data: bytes, *, timeout_s: float) -> None:
        if self.filesystem is None:
            _durable_write(_local(uri), data)
            return
        fs = self.filesystem
        path = fs._strip_protocol(uri)
        # Object stores show an object only once its PUT completes, so a plain write is already all-or-nothing.
        if self._is_async:
            self._run_async(lambda: fs._pipe_file(path, data), timeout_s, f"writing {uri}")
        else:
            self._run_blocking(lambda: fs.pipe_file(path, data), timeout_s, uri)

    # -- deadlines ----------------------------------------------------------------------------------------------

    @property
    def _is_async(self) -> bool:
        return bool(getattr(self.filesystem, "async_impl", False))

    def _run_async(self, make: Callable[[], Awaitable[T]], timeout_s: float, what: str) -> T:
        from fsspec.asyn import sync

        async def bounded() -> T:
            try:
                return await asyncio.wait_for(_as_coroutine(make()), timeout=max(timeout_s, 0.001))
            except TimeoutError:
                raise StorageTimeoutError(f"Gave up {what} after its deadline of {timeout_s:.1f} s.") from None

        result: T = sync(self.filesystem.loop, bounded)
        return result

    def _run_blocking(self, fn: Callable[[], T], timeout_s: float, uri: str) -> T:
        """Synchronous filesystems cannot be cancelled: the call runs in a daemon thread that is left behind."""
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = fn()
            except BaseException as error:
                box["error"] = error

        thread = threading.Thread(target=target, name="elastrain-durable-io", daemon=True)
        thread.start()
        thread.join(max(timeout_s, 0.001))
        if thread.is_alive():
            raise StorageTimeoutError(f"Gave up on {uri} after its deadline of {timeout_s:.1f} s.")
        if "error" in box:
            raise box["error"]
        value: T = box["value"]
        return value


async def _as_coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable


async def _bounded(calls: list[Callable[[], Coroutine[Any, Any, Any]]], limit: int) -> None:
    """Run the calls, ``limit`` at a time; the first error cancels the rest."""
    semaphore = asyncio.Semaphore(limit)

    async def one(call: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        async with semaphore:
            await call()

    tasks = [asyncio.ensure_future(one(call)) for call in calls]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()


async def _remove_folder_entries(fs: Any, base: str, files: list[str]) -> None:
    """S3 servers with real folders (SeaweedFS) keep a deleted prefix as an empty folder until its ``key/`` is
    deleted, deepest first; on plain object stores these deletes are no-ops."""
    if not hasattr(fs, "_call_s3"):
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


def _walk(top: str) -> list[tuple[str, str]]:
    return sorted((root, name) for root, _, names in os.walk(top, followlinks=True) for name in names)


def _relative(top: str, root: str, name: str) -> str:
    return os.path.relpath(os.path.join(root, name), top)


def _local(uri: str) -> str:
    for prefix in ("file://", "local://"):
        if uri.startswith(prefix):
            return uri[len(prefix) :]
    return uri


def _durable_copy(source: str, target: str) -> None:
    """Copy and fsync: a commit that follows must not outlive the data it points at."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(source, "rb") as reader, open(target, "wb") as writer:
        shutil.copyfileobj(reader, writer, 8 << 20)
        writer.flush()
        os.fsync(writer.fileno())


def _durable_write(path: str, data: bytes) -> None:
    """Write to a temporary name, fsync, rename over, fsync the folder: readers see nothing or everything."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temporary, "wb") as writer:
            writer.write(data)
            writer.flush()
            os.fsync(writer.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
