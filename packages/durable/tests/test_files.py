"""What a checkpoint holds: one walk for manifest, upload and restore (symbolic links followed), and manifests
that always describe the bytes that were uploaded."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from conftest import tree_contents

from elastrain.durable import CheckpointStore, CommandSyncClient, FilesChangedError, FsspecSyncClient


def test_symlinked_files_and_folders_are_saved_with_their_content(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    (shared / "tokenizer").mkdir(parents=True)
    (shared / "tokenizer" / "vocab.txt").write_text("a b c")
    (shared / "base.bin").write_bytes(b"base weights")
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "adapter.bin").write_bytes(b"adapter")
    (checkpoint / "tokenizer").symlink_to(shared / "tokenizer", target_is_directory=True)
    (checkpoint / "base.bin").symlink_to(shared / "base.bin")
    with CheckpointStore(tmp_path / "store") as store:
        for staging in ("copy", "link"):
            committed = store.save_async(checkpoint, staging=staging).result(30)  # type: ignore[arg-type]
            assert sorted(entry.path for entry in committed.files) == ["adapter.bin", "base.bin", "tokenizer/vocab.txt"]
        committed = store.save(checkpoint)
        target = tmp_path / "restored"
        store.restore(committed, local_dir=target)
    assert tree_contents(target) == {
        "adapter.bin": b"adapter",
        "base.bin": b"base weights",
        "tokenizer/vocab.txt": b"a b c",
    }
    assert not any(path.is_symlink() for path in target.rglob("*"))


@pytest.mark.parametrize("problem", ["loop", "broken", "fifo"])
def test_folders_that_cannot_be_saved_are_refused_clearly(tmp_path: Path, problem: str) -> None:
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "inner").mkdir(parents=True)
    (checkpoint / "weights.bin").write_bytes(b"w")
    if problem == "loop":
        (checkpoint / "inner" / "again").symlink_to(checkpoint, target_is_directory=True)
        expected: tuple[type[Exception], str] = (ValueError, "links back to a folder that contains it")
    elif problem == "broken":
        (checkpoint / "inner" / "gone.bin").symlink_to(tmp_path / "nowhere.bin")
        expected = (FileNotFoundError, "symbolic link to .*nowhere.bin.*which does not exist")
    else:
        os.mkfifo(checkpoint / "inner" / "pipe")
        expected = (ValueError, "not a regular file")
    with CheckpointStore(tmp_path / "store") as store:
        for save in (lambda: store.save(checkpoint), lambda: store.save_async(checkpoint).result(30)):
            with pytest.raises(expected[0], match=expected[1]):
                save()
        assert store.list() == []


def test_a_file_rewritten_during_a_linked_upload_is_never_committed(tmp_path: Path) -> None:
    """The default client checksums the bytes it sends, so a manifest always matches its files; a file changed
    meanwhile would still commit a mix of old and new bytes, so the save fails instead."""
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    weights = checkpoint / "weights.bin"
    weights.write_bytes(b"version 1" * 1000)

    class TrainingWritesMeanwhile(FsspecSyncClient):
        def _upload_described(self, local_dir: str, uri: str, *, timeout_s: float) -> Any:
            with open(weights, "r+b") as rewrite:  # in place: the staged hard link sees it
                rewrite.write(b"version 2")
            return super()._upload_described(local_dir, uri, timeout_s=timeout_s)

    with CheckpointStore(tmp_path / "store", sync_client=TrainingWritesMeanwhile()) as store:
        with pytest.raises(FilesChangedError, match="staging='copy'"):
            store.save_async(checkpoint, staging="link").result(30)
        assert store.list() == []
        store.save_async(checkpoint, staging="copy").result(30)  # a private copy: rewriting it is harmless
        committed = store.latest()
        assert committed is not None
        store.restore(committed, local_dir=tmp_path / "restored")
    assert (tmp_path / "restored" / "weights.bin").read_bytes() == b"version 2" + b"version 1" * 999


def test_a_subclass_that_overrides_upload_is_used(tmp_path: Path) -> None:
    calls: list[str] = []

    class Audited(FsspecSyncClient):
        def upload(self, local_dir: str, uri: str, *, timeout_s: float) -> None:
            calls.append(uri)
            super().upload(local_dir, uri, timeout_s=timeout_s)

    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "w.bin").write_bytes(b"w")
    with CheckpointStore(tmp_path / "store", sync_client=Audited()) as store:
        store.save(checkpoint)
    assert len(calls) == 1


def test_a_client_that_reads_files_itself_never_commits_a_rewritten_file(tmp_path: Path) -> None:
    """Clients that read the files themselves (commands) get them checksummed first and checked afterwards."""
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    weights = checkpoint / "weights.bin"
    weights.write_bytes(b"version 1")

    class Copy(CommandSyncClient):
        rewrite = True

        def upload(self, local_dir: str, uri: str, *, timeout_s: float) -> None:
            if self.rewrite and "_manifests" not in uri and Path(uri).name.startswith("checkpoint_"):
                weights.write_bytes(b"version 2")  # training saves again while the command runs
                self.rewrite = False
            super().upload(local_dir, uri, timeout_s=timeout_s)

    sync = 'sh -c \'mkdir -p "$1" && if [ -d "$0" ]; then cp -R "$0"/. "$1"; fi\' {source} {target}'
    copy = Copy(sync_up=sync, sync_down=sync, delete="rm -rf {target}")
    with CheckpointStore(tmp_path / "store", sync_client=copy) as store:
        with pytest.raises(FilesChangedError, match="staging='copy'"):
            store.save_async(checkpoint, staging="link").result(30)
        assert store.list() == []
        weights.write_bytes(b"version 3")
        store.save_async(checkpoint, staging="link").result(30)  # nothing changed this time
        assert [len(c.files) for c in store.list()] == [1]


def test_a_new_store_reads_all_manifests_in_one_batch(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "w.bin").write_bytes(b"w")
    with CheckpointStore(tmp_path / "store") as writer:
        for step in range(12):
            writer.save(checkpoint, step=step)

    class Counting(FsspecSyncClient):
        def __init__(self) -> None:
            super().__init__()
            self.batches: list[int] = []

        def read_many(self, uris: list[str], *, timeout_s: float) -> dict[str, bytes | None]:
            self.batches.append(len(uris))
            return super().read_many(uris, timeout_s=timeout_s)

    client = Counting()
    with CheckpointStore(tmp_path / "store", sync_client=client) as reader:
        assert [c.step for c in reader.list()] == list(range(12))
        assert [c.step for c in reader.list()] == list(range(12))  # known ones are not read again
    assert client.batches == [12]
