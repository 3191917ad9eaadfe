"""Deadlines on local and mounted folders, where a hung mount blocks a system call for good. A FIFO with no
peer blocks ``open()`` in the same uncancellable way, so it stands in for the hung mount here."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elastrain.durable import CheckpointStore, FsspecSyncClient, StorageTimeoutError


@contextlib.contextmanager
def hung(path: Path) -> Iterator[Path]:
    """A FIFO at ``path``: opening it blocks until the other end opens. On exit the other end opens and closes,
    so the threads left blocked finish (a real hung mount would keep them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    try:
        yield path
    finally:
        for flags in (os.O_WRONLY | os.O_NONBLOCK, os.O_RDONLY | os.O_NONBLOCK):
            with contextlib.suppress(OSError):
                os.close(os.open(path, flags))


def test_local_client_calls_give_up_at_their_deadline(tmp_path: Path) -> None:
    client = FsspecSyncClient()
    with hung(tmp_path / "manifest.json") as manifest, pytest.raises(StorageTimeoutError, match="reading"):
        client.read_bytes(str(manifest), timeout_s=0.5)
    with hung(tmp_path / "store" / "manifest.json") as manifest, pytest.raises(StorageTimeoutError):
        client.read_many([str(manifest)], timeout_s=0.5)


def test_a_hung_store_fails_saves_and_flushes_instead_of_blocking(tmp_path: Path) -> None:
    root = tmp_path / "store"
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "weights.bin").write_bytes(b"w" * 1000)
    with hung(root / "_manifests" / "checkpoint_000000001_abcdef" / "MANIFEST.json"):
        store = CheckpointStore(root, timeout_s=1.0, retries=0)
        with pytest.raises(StorageTimeoutError):
            store.list()
        first = store.save_async(checkpoint, step=1)
        second = store.save_async(checkpoint, step=2)  # waits for the first, which gives up at its deadline
        with pytest.raises(StorageTimeoutError):
            second.result(30)
        assert isinstance(first.exception(0), StorageTimeoutError)
        store.save_async(checkpoint, step=3)
        with pytest.raises(StorageTimeoutError):
            store.close()  # the final flush ends with the last save's error, not a hang


def test_one_deadline_covers_the_whole_save(tmp_path: Path) -> None:
    """Each step of a save (looking up the order, the marker, the upload, the commit) is slow but within the
    store's timeout on its own; together they are not, and the save gives up at the one deadline."""
    never = threading.Event()

    class SlowStorage(FsspecSyncClient):
        def _slow(self) -> None:
            never.wait(0.3)  # storage that answers each call in 0.3 s

        def list_names(self, uri: str, *, timeout_s: float) -> list[str]:
            self._slow()
            return super().list_names(uri, timeout_s=timeout_s)

        def write_bytes(self, uri: str, data: bytes, *, timeout_s: float) -> None:
            self._slow()
            super().write_bytes(uri, data, timeout_s=timeout_s)

        def _upload_described(self, local_dir: str, uri: str, *, timeout_s: float) -> Any:
            self._slow()
            return super()._upload_described(local_dir, uri, timeout_s=timeout_s)

    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "weights.bin").write_bytes(b"w")
    with CheckpointStore(tmp_path / "store", timeout_s=1.0, retries=0, sync_client=SlowStorage()) as store:
        with pytest.raises(StorageTimeoutError, match="deadline"):
            store.save(checkpoint, step=1)
        assert store.list() == []
