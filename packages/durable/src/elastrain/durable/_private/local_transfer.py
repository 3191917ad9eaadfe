"""Local and mounted (NFS) folders: copies that checksum the bytes they move, under a deadline.

A hung mount blocks a system call where no signal reaches it, so every operation runs in a daemon thread and
the caller stops waiting at its deadline (the thread is left behind, as for any uncancellable call; it does not
hold up the interpreter's exit). Several files copy at once: checksumming takes about as long as copying.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import queue
import shutil
import threading
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from elastrain.durable._private.checkpoint import FileEntry
from elastrain.durable._private.errors import StorageTimeoutError
from elastrain.durable._private.files import walk_files

T = TypeVar("T")
_CHUNK = 8 << 20
_COPY_THREADS = 4


def run_with_deadline(fn: Callable[[], T], timeout_s: float, what: str, abandoned: threading.Event | None = None) -> T:
    """``fn()`` in a daemon thread; ``StorageTimeoutError`` once ``timeout_s`` passes without it returning.

    ``abandoned`` is set then: ``fn`` checks it where it can, so a call that wakes up late stops (and, above all,
    never finishes a write the caller has given up on and may have retried).
    """
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
        if abandoned is not None:
            abandoned.set()
        raise StorageTimeoutError(
            f"Gave up {what} after its deadline of {timeout_s:.1f} s (is the storage hung or unreachable?)."
        )
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value


def copy_tree(source_dir: str, target_dir: str, abandoned: threading.Event) -> list[FileEntry]:
    """Copy every file under ``source_dir`` to ``target_dir`` (fsynced); the entries describe what was read.

    The files go to a sibling folder of this attempt's own, renamed to ``target_dir`` at the end (replacing what
    an earlier attempt left there): an attempt abandoned at its deadline that wakes up later never overwrites
    the files of the retry that replaced it.
    """
    pairs = walk_files(source_dir)
    partial = f"{target_dir.rstrip(os.sep)}{PARTIAL_SUFFIX}{uuid.uuid4().hex[:8]}"
    try:
        results = map_daemon(
            lambda pair: copy_file(pair[0], os.path.join(partial, pair[1]), abandoned), pairs, abandoned
        )
        os.makedirs(partial, exist_ok=True)
        if abandoned.is_set():
            raise StorageTimeoutError("abandoned at its deadline")
        if os.path.isdir(target_dir) and os.listdir(target_dir):
            shutil.rmtree(target_dir)  # an earlier attempt's leftovers (names are never shared between saves)
        os.replace(partial, target_dir)
    finally:
        remove(partial)
    return [FileEntry(relative, size, digest) for (_, relative), (size, digest) in zip(pairs, results, strict=True)]


# What a copy in progress is called next to its target (collection recognizes and removes leftovers).
PARTIAL_SUFFIX = ".partial-"


def copy_file(source: str, target: str, abandoned: threading.Event | None = None) -> tuple[int, str]:
    """Copy and fsync (a commit that follows must not outlive the data it points at); size and SHA-256 of the
    bytes copied, which are the ones that count even if the source changes meanwhile."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    with open(source, "rb") as reader, open(target, "wb") as writer:
        while chunk := reader.read(_CHUNK):
            if abandoned is not None and abandoned.is_set():
                raise StorageTimeoutError("abandoned at its deadline")
            digest.update(chunk)
            writer.write(chunk)
            size += len(chunk)
        writer.flush()
        os.fsync(writer.fileno())
    return size, digest.hexdigest()


def durable_write(path: str, data: bytes, abandoned: threading.Event | None = None) -> None:
    """Write to a temporary name, fsync, rename over, fsync the folder: readers see nothing or everything.

    A write abandoned at its deadline never renames: a manifest must not appear after its save gave up."""
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    temporary = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temporary, "wb") as writer:
            writer.write(data)
            writer.flush()
            os.fsync(writer.fileno())
        if abandoned is not None and abandoned.is_set():
            raise StorageTimeoutError("abandoned at its deadline")
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


def remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def map_daemon(
    fn: Callable[[Any], T], items: list[Any], abandoned: threading.Event, max_threads: int = _COPY_THREADS
) -> list[T]:
    """``[fn(item) ...]`` on up to ``max_threads`` daemon threads (a pool's threads would be joined at exit, and one
    stuck on a hung mount would then hold the process); the first error is raised once all have stopped."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    results: list[Any] = [None] * len(items)
    errors: list[BaseException] = []
    work: queue.SimpleQueue[int] = queue.SimpleQueue()
    for index in range(len(items)):
        work.put(index)

    def worker() -> None:
        while not errors and not abandoned.is_set():
            try:
                index = work.get_nowait()
            except queue.Empty:
                return
            try:
                results[index] = fn(items[index])
            except BaseException as error:
                errors.append(error)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(max_threads, len(items)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results
