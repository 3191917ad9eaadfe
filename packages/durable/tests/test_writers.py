"""Several writers on one store, and collection racing commits: nothing older than what is committed becomes
latest, nothing committed is collected by accident. Two stores in one process on one local folder stand for
the former and the new rank 0 of an elastic job."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import tree_contents

from elastrain.durable import CheckpointStore, FsspecSyncClient, StaleCheckpointError, StatePersistence


def folder(root: Path, name: str, content: bytes) -> Path:
    path = root / name
    path.mkdir()
    (path / "state.bin").write_bytes(content)
    return path


class HookedClient(FsspecSyncClient):
    """The local client with a hook that runs once, before the first call of one operation (what another
    writer does meanwhile)."""

    def __init__(self, operation: str, hook: Callable[[], None], when: Callable[..., bool] = lambda *_: True):
        super().__init__()
        self.operation, self.hook, self.when = operation, hook, when
        self.fired = False

    def _maybe_fire(self, operation: str, *args: Any) -> None:
        if operation == self.operation and not self.fired and self.when(*args):
            self.fired = True
            self.hook()

    def _upload_described(self, local_dir: str, uri: str, *, timeout_s: float) -> Any:
        self._maybe_fire("upload", uri)
        return super()._upload_described(local_dir, uri, timeout_s=timeout_s)

    def write_bytes(self, uri: str, data: bytes, *, timeout_s: float) -> None:
        self._maybe_fire("write", uri)
        super().write_bytes(uri, data, timeout_s=timeout_s)

    def list_names(self, uri: str, *, timeout_s: float) -> list[str]:
        self._maybe_fire("list", uri)
        return super().list_names(uri, timeout_s=timeout_s)


class GatedClient(FsspecSyncClient):
    """The local client whose uploads wait at a gate until released (a writer whose upload is under way)."""

    def __init__(self) -> None:
        super().__init__()
        self.at_gate, self.release = threading.Event(), threading.Event()

    def _upload_described(self, local_dir: str, uri: str, *, timeout_s: float) -> Any:
        self.at_gate.set()
        assert self.release.wait(30)
        return super()._upload_described(local_dir, uri, timeout_s=timeout_s)


def test_a_save_older_than_the_committed_step_is_refused(tmp_path: Path) -> None:
    uri = tmp_path / "store"
    with CheckpointStore(uri, num_to_keep=2) as new_writer, CheckpointStore(uri, num_to_keep=2) as old_writer:
        new_writer.save(folder(tmp_path, "a", b"10"), step=10)
        new_writer.save(folder(tmp_path, "b", b"12"), step=12)
        with pytest.raises(StaleCheckpointError, match="step 12 is already committed"):
            old_writer.save(folder(tmp_path, "c", b"11"), step=11)
        old_writer.save(folder(tmp_path, "d", b"12 again"), step=12)  # the same step is no regression
        old_writer.wait()  # its collection
        assert [c.step for c in new_writer.list()] == [12, 12]
        assert len([p for p in uri.iterdir() if p.name.startswith("checkpoint_")]) == 2


def test_a_newer_commit_during_an_upload_fences_the_older_one(tmp_path: Path) -> None:
    uri = tmp_path / "store"
    with CheckpointStore(uri, num_to_keep=1) as new_writer:
        client = HookedClient("upload", lambda: new_writer.save(folder(tmp_path, "new", b"new"), step=12))
        with CheckpointStore(uri, num_to_keep=1, sync_client=client) as old_writer:
            with pytest.raises(StaleCheckpointError):
                old_writer.save(folder(tmp_path, "old", b"old"), step=11)
            assert client.fired
            latest = new_writer.latest()
            assert latest is not None
            assert latest.step == 12
            new_writer.restore(local_dir=tmp_path / "restored")
            assert tree_contents(tmp_path / "restored") == {"state.bin": b"new"}
            # The refused upload's files were removed with it.
            assert sorted(p.name for p in uri.iterdir() if p.name.startswith("checkpoint_")) == [latest.name]


def test_a_late_copy_that_slips_past_the_fence_never_becomes_latest(tmp_path: Path) -> None:
    """The new writer's upload (step 12) began first; the former writer's (step 11) began later, so it has the
    higher sequence, and commits in the instant after the new one. Ordered by step, it is not the latest, and
    with num_to_keep=1 the former writer's own collection removes its copy, not the newer one."""
    uri = tmp_path / "store"
    gated = GatedClient()
    at_gate, release_new = gated.at_gate, gated.release

    with CheckpointStore(uri, num_to_keep=1, sync_client=gated) as new_writer:
        newer = new_writer.save_async(folder(tmp_path, "new", b"new"), step=12)
        assert at_gate.wait(30)

        def new_writer_commits() -> None:
            release_new.set()
            newer.result(30)

        client = HookedClient("write", new_writer_commits, when=lambda uri: str(uri).endswith("MANIFEST.json"))
        with CheckpointStore(uri, num_to_keep=1, sync_client=client) as old_writer:
            late = old_writer.save(folder(tmp_path, "old", b"old"), step=11)
            old_writer.wait()  # its collection
            assert client.fired
            assert late.sequence > newer.result().sequence  # by sequence alone the late copy would be latest
            assert [c.step for c in old_writer.list()] == [12]
            assert [c.step for c in new_writer.list()] == [12]
    reader = CheckpointStore(uri)
    assert [c.step for c in reader.list()] == [12]  # on storage too, not only in what the stores show
    reader.close()


def test_collection_never_takes_an_upload_that_commits_while_it_lists(tmp_path: Path) -> None:
    """Writer B's upload began before writer A's (a lower sequence) and commits, with a later step, while A's
    collection lists the store."""
    uri = tmp_path / "store"
    gated = GatedClient()
    at_gate, release_b = gated.at_gate, gated.release

    with CheckpointStore(uri, sync_client=gated) as writer_b:
        b_future = writer_b.save_async(folder(tmp_path, "b", b"B"), step=3)
        assert at_gate.wait(30)  # B has its sequence and its marker; its files are on the way

        def let_b_commit() -> None:
            release_b.set()
            b_future.result(30)

        # A lists the upload markers twice: for its own sequence, then in its collection. B commits right then.
        pending_listings = iter(range(10))

        def in_collection(uri: str) -> bool:
            return str(uri).endswith("_pending") and next(pending_listings) == 1

        client = HookedClient("list", let_b_commit, when=in_collection)
        with CheckpointStore(uri, sync_client=client) as writer_a:
            writer_a.save(folder(tmp_path, "a", b"A"), step=2)
            writer_a.wait(60)  # its collection
            assert client.fired
        committed = {c.step: c for c in writer_b.list()}
        assert set(committed) == {2, 3}
        assert committed[3].sequence < committed[2].sequence
        writer_b.restore(committed[3], local_dir=tmp_path / "restored")
        assert tree_contents(tmp_path / "restored") == {"state.bin": b"B"}


class Countdown:
    """An elastic state, as the executor hands it to persistence (commit_count and snapshot())."""

    def __init__(self, commits: int) -> None:
        self.commit_count = commits

    def snapshot(self) -> dict[str, int]:
        return {"commits": self.commit_count}


def test_a_former_rank_0_drops_its_queued_copy(tmp_path: Path) -> None:
    uri = tmp_path / "persisted"
    started, release = threading.Event(), threading.Event()

    class SlowClient(FsspecSyncClient):
        def _upload_described(self, local_dir: str, uri: str, *, timeout_s: float) -> Any:
            started.set()
            assert release.wait(30)
            return super()._upload_described(local_dir, uri, timeout_s=timeout_s)

    persistence = StatePersistence(uri, every=1, num_to_keep=None, sync_client=SlowClient())
    persistence.committed(Countdown(1))  # uploading
    assert started.wait(30)
    persistence.committed(Countdown(2))  # queued behind it
    persistence.rank_changed(1)  # a reset made this worker rank 1: the new rank 0 persists from now on
    release.set()
    persistence.flush(30)
    assert [c.step for c in persistence.store.list()] == [1]
    persistence.rank_changed(0)  # rank 0 keeps what it queued
    persistence.committed(Countdown(3))
    persistence.flush(30)
    assert [c.step for c in persistence.store.list()] == [1, 3]
    persistence.close()


def test_a_stale_copy_is_not_a_persistence_error(tmp_path: Path) -> None:
    uri = tmp_path / "persisted"
    with CheckpointStore(uri) as new_rank_0:
        new_rank_0.save(folder(tmp_path, "new", b"x"), step=5, metrics={"commits": 5})
    persistence = StatePersistence(uri, every=1, num_to_keep=None)
    persistence.committed(Countdown(4))
    persistence.flush(30)  # refused by the fence, logged, not raised: nothing was lost
    assert [c.step for c in persistence.store.list()] == [5]
    persistence.close()


def test_a_corrupted_latest_skipped_by_fallback_stops_counting(tmp_path: Path) -> None:
    """Resuming from an older checkpoint because the newest is corrupted must not leave the corrupted one as
    latest, refusing every later save below its step."""
    uri = tmp_path / "store"
    with CheckpointStore(uri) as store:
        store.save(folder(tmp_path, "a", b"10"), step=10)
        corrupted = store.save(folder(tmp_path, "b", b"20"), step=20)
        (uri / corrupted.name / "state.bin").write_bytes(b"bit rot")
        assert store.restore(local_dir=tmp_path / "restored", fallback=True).step == 10
        assert [c.step for c in store.list()] == [10]
        store.save(folder(tmp_path, "c", b"11"), step=11)  # training goes on from step 10
        store.wait()
        assert [c.step for c in store.list()] == [10, 11]
        assert not (uri / corrupted.name).exists()  # its files went with the collection
