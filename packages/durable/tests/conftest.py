from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

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
