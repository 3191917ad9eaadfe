from __future__ import annotations

import contextlib
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from elastrain.durable import CheckpointNotFoundError, CheckpointStore, StorageError
from elastrain_testutils.storage_servers import FakeGcs, MotoS3, SeaweedS3

_buckets = itertools.count()


def make_tree(root: Path, *, big_bytes: int = 0) -> Path:
    """A checkpoint-like folder: nested files, an empty file and, optionally, one big file."""
    (root / "model" / "shards").mkdir(parents=True)
    (root / "model" / "shards" / "0.bin").write_bytes(os.urandom(300_000))
    (root / "model" / "shards" / "1.bin").write_bytes(os.urandom(1_000))
    (root / "model" / "config.json").write_text('{"layers": 2}')
    (root / "empty.txt").write_bytes(b"")
    (root / "optimizer.pt").write_bytes(os.urandom(50_000))
    if big_bytes:
        with open(root / "big.bin", "wb") as out:
            for _ in range(big_bytes // (1 << 20)):
                out.write(os.urandom(1 << 20))
    return root


def tree_contents(root: Path) -> dict[str, bytes]:
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "tree")


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    with MotoS3() as server:
        yield server


@pytest.fixture(scope="session")
def seaweed_s3() -> Iterator[SeaweedS3]:
    with SeaweedS3() as server:
        yield server


@pytest.fixture(scope="session")
def fake_gcs() -> Iterator[FakeGcs]:
    with FakeGcs() as server:
        yield server


def new_bucket(server: MotoS3 | SeaweedS3 | FakeGcs) -> str:
    name = f"elastrain-test-{os.getpid()}-{next(_buckets)}"
    server.create_bucket(name)
    return name


@contextlib.contextmanager
def silent_server() -> Iterator[int]:
    """A server on 127.0.0.1 that accepts connections and never replies; yields its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                held.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for connection in held:
            connection.close()
        listener.close()


def assert_save_fails_within_its_deadline(store: CheckpointStore, tree: Path) -> None:
    """``store`` (timeout_s=3) talks to a silent server: training is not blocked, and the save fails in time."""
    started = time.monotonic()
    future = store.save_async(tree)
    assert time.monotonic() - started < 2  # staging only: the silent server does not block training
    with pytest.raises(StorageError):
        future.result(60)
    assert time.monotonic() - started < 15
    store.close()


def assert_an_uncommit_cut_short_is_finished(
    remembering: CheckpointStore, new_store: Callable[[], CheckpointStore], tree: Path, tmp_path: Path
) -> None:
    """A collector killed between deleting a manifest and its folder (real folders keep the emptied one): no
    store offers that checkpoint, one that read it before forgets it, and the next commit removes what is left."""
    for step in range(3):
        remembering.save(tree, step=step)
    first = remembering.list()[0]  # read and remembered
    root = remembering.location.root
    client = remembering.client
    client.delete(f"{root}/_manifests/{first.name}/MANIFEST.json", timeout_s=30)

    with new_store() as fresh:
        assert [c.step for c in fresh.list()] == [1, 2]
    with pytest.raises(CheckpointNotFoundError, match="collected"):
        remembering.restore(first.name, local_dir=tmp_path / "gone")
    assert [c.step for c in remembering.list()] == [1, 2]
    assert remembering.restore(local_dir=tmp_path / "latest").step == 2

    remembering.save(tree, step=3)  # its collection finishes the one cut short
    remembering.wait()
    assert first.name not in client.list_names(f"{root}/_manifests", timeout_s=30)
    assert first.name not in client.list_names(root, timeout_s=30)
    with new_store() as fresh:
        assert [c.step for c in fresh.list()] == [1, 2, 3]
