"""One folder of snapshot files, local or behind any fsspec URI, every operation under a deadline.

Each operation runs on a helper thread that the caller waits for at most ``timeout_s``: a hung object store
delays a snapshot round, never the actor. A thread still hanging after its deadline is not replaced (threads
cannot be killed); the next operations fail at once until it returns, so hanging threads never pile up.

Local writes go to a temporary name, are fsynced and renamed, and a failed write removes its temporary file;
other URIs are written with one PUT, which object stores show only once complete.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
TEMPORARY_SUFFIX = ".tmp"


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def local_path(uri: str) -> str:
    return uri[len("file://") :] if uri.startswith("file://") else uri


class Store:
    def __init__(self, uri: str, timeout_s: float) -> None:
        self.uri = uri.rstrip("/") or "/"
        self.timeout_s = timeout_s
        self.local = is_local(uri)
        self._root = local_path(self.uri) if self.local else self.uri
        self._filesystem: Any = None
        self._hanging: threading.Thread | None = None

    def path(self, name: str) -> str:
        return f"{self._root}/{name}"

    # -- operations (each under the deadline) ------------------------------------------------------------

    def names(self) -> list[str]:
        """The names of the files in the folder (none when it does not exist yet)."""
        return self._deadline("list", self._names)

    def read(self, name: str) -> bytes:
        return self._deadline(f"read {name}", lambda: self._read(name))

    def write(self, name: str, data: bytes) -> None:
        self._deadline(f"write {name}", lambda: self._write(name, data))

    def delete(self, name: str) -> None:
        self._deadline(f"delete {name}", lambda: self._delete(name))

    def move(self, name: str, new_name: str) -> None:
        self._deadline(f"move {name}", lambda: self._move(name, new_name))

    # -- internals -----------------------------------------------------------------------------------------

    def _deadline(self, what: str, operation: Callable[[], T]) -> T:
        if self._hanging is not None and self._hanging.is_alive():
            raise TimeoutError(f"an earlier snapshot operation on {self.uri} is still hanging; not starting {what}")
        outcome: list[Any] = []

        def run() -> None:
            try:
                outcome.append((True, operation()))
            except BaseException as error:  # handed to the waiting caller
                outcome.append((False, error))

        thread = threading.Thread(target=run, name="elastrain-state-io", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            self._hanging = thread
            raise TimeoutError(f"{what} on {self.uri} took longer than {self.timeout_s:g} s (io_timeout_s)")
        succeeded, value = outcome[0]
        if not succeeded:
            raise value
        result: T = value
        return result

    def _fs(self) -> Any:
        if self._filesystem is None:
            import fsspec

            self._filesystem, _ = fsspec.core.url_to_fs(self.uri)
        return self._filesystem

    def _names(self) -> list[str]:
        if self.local:
            try:
                return os.listdir(self._root)
            except FileNotFoundError:
                return []
        fs = self._fs()
        try:
            entries = fs.ls(self._root, detail=False)
        except FileNotFoundError:
            return []
        return [str(entry).rstrip("/").rsplit("/", 1)[-1] for entry in entries]

    def _read(self, name: str) -> bytes:
        if self.local:
            with open(self.path(name), "rb") as reader:
                return reader.read()
        data: bytes = self._fs().cat_file(self.path(name))
        return data

    def _write(self, name: str, data: bytes) -> None:
        if not self.local:
            self._fs().pipe_file(self.path(name), data)
            return
        os.makedirs(self._root, exist_ok=True)
        temporary = self.path(f"{name}.{uuid.uuid4().hex}{TEMPORARY_SUFFIX}")
        try:
            with open(temporary, "wb") as writer:
                writer.write(data)
                writer.flush()
                os.fsync(writer.fileno())
            os.replace(temporary, self.path(name))
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(temporary)
            raise

    def _delete(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            if self.local:
                os.remove(self.path(name))
            else:
                self._fs().rm_file(self.path(name))

    def _move(self, name: str, new_name: str) -> None:
        if self.local:
            os.makedirs(os.path.dirname(self.path(new_name)), exist_ok=True)
            os.replace(self.path(name), self.path(new_name))
        else:
            self._fs().mv(self.path(name), self.path(new_name))
