"""Snapshots without Ray: the base + journal layout, compaction, deadlines, and no temporary file left behind."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from elastrain.state import RunStatus, TrainRunInfo
from elastrain.state._private import persistence as persistence_module
from elastrain.state._private.persistence import Persistence
from elastrain.state._private.snapshot import Snapshots, base_name, segment_name
from elastrain.state._private.store import Store


def document(index: int, status: RunStatus = RunStatus.FINISHED) -> str:
    return TrainRunInfo(
        name=f"run-{index}", id=f"id-{index}", job_id="job", run_status=status, start_time_ms=1_000 + index
    ).model_dump_json()


def test_base_then_journal_segments_load_in_order(tmp_path: Path) -> None:
    snapshots = Snapshots(Store(str(tmp_path), timeout_s=30))
    snapshots.write_base(3, [document(i) for i in range(5)])
    snapshots.write_segment(3, 1, [document(1, RunStatus.ERRORED)], removed=["id-0"])
    snapshots.write_segment(3, 2, [document(9)], removed=[])
    loaded = snapshots.load()
    assert sorted(loaded.runs) == ["id-1", "id-2", "id-3", "id-4", "id-9"]
    assert loaded.runs["id-1"].run_status is RunStatus.ERRORED
    assert (loaded.generation, loaded.next_seq, loaded.segments) == (3, 3, 2)
    assert not loaded.problems
    # Compaction: the next generation's base replaces every file of older ones.
    snapshots.write_base(4, [document(i) for i in range(2)])
    assert sorted(os.listdir(tmp_path)) == [base_name(4)]
    assert sorted(snapshots.load().runs) == ["id-0", "id-1"]


def test_a_failed_local_write_leaves_no_temporary_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(str(tmp_path), timeout_s=30)

    def broken_fsync(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space left"):
        store.write(base_name(1), b"{}")
    assert os.listdir(tmp_path) == []


def test_temporary_files_of_a_crashed_writer_are_removed_on_load(tmp_path: Path) -> None:
    snapshots = Snapshots(Store(str(tmp_path), timeout_s=30))
    snapshots.write_base(1, [document(1)])
    (tmp_path / f"{segment_name(1, 1)}.0123abcd.tmp").write_bytes(b'{"half')
    assert list(snapshots.load().runs) == ["id-1"]
    assert os.listdir(tmp_path) == [base_name(1)]


def test_an_operation_past_its_deadline_fails_and_a_hanging_one_is_not_piled_on(tmp_path: Path) -> None:
    store = Store(str(tmp_path), timeout_s=0.2)
    release = threading.Event()
    real_write = Store._write

    def hanging_write(self: Store, name: str, data: bytes) -> None:
        release.wait(60)
        real_write(self, name, data)

    store._write = hanging_write.__get__(store)  # type: ignore[method-assign]
    try:
        with pytest.raises(TimeoutError, match=r"took longer than 0\.2 s"):
            store.write("a.json", b"{}")
        with pytest.raises(TimeoutError, match="still hanging"):
            store.names()
    finally:
        release.set()
    assert "a.json" in store_names_when_free(store)


def store_names_when_free(store: Store) -> list[str]:
    from elastrain_testutils.waiting import wait_until

    def names() -> list[str] | None:
        try:
            return store.names()
        except TimeoutError:
            return None

    found: list[str] = wait_until(names, timeout_s=30, what="the hanging write to return")
    return found


class FakeActor:
    """What the persistence thread asks of the actor, over a dict of JSON documents."""

    def __init__(self) -> None:
        self.runs: dict[str, str] = {}
        self.restored: dict[str, TrainRunInfo] = {}

    def persistence(self, uri: str) -> Persistence:
        return Persistence(
            uri,
            interval_s=3600.0,  # rounds only when flushed
            timeout_s=30.0,
            documents=lambda ids: {run_id: self.runs.get(run_id) for run_id in ids},
            all_documents=lambda: list(self.runs.values()),
            restore=lambda runs, _cluster, _histories: self.restored.update(runs),
        )


def test_only_changed_runs_are_written_and_the_journal_is_compacted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    actor = FakeActor()
    actor.runs = {f"id-{i}": document(i) for i in range(200)}
    persistence = actor.persistence(str(tmp_path))
    persistence.flush()
    first = persistence.info()["last_write"]
    assert (first["kind"], first["runs"]) == ("base", 200)  # the first round after loading writes a base
    actor.runs["id-7"] = document(7, RunStatus.ERRORED)
    persistence.changed("id-7")
    del actor.runs["id-3"]
    persistence.removed("id-3")
    persistence.flush()
    info: dict[str, Any] = persistence.info()
    assert (info["last_write"]["kind"], info["last_write"]["runs"], info["last_write"]["removed"]) == ("journal", 1, 1)
    assert info["last_write"]["bytes"] < first["bytes"] / 50
    writes = info["writes"]
    persistence.flush()  # nothing changed: nothing written
    assert persistence.info()["writes"] == writes
    # Once the journal holds MAX_SEGMENTS segments (or more bytes than the base), a round writes a base instead.
    monkeypatch.setattr(persistence_module, "MAX_SEGMENTS", 4)
    kinds = []
    for index in range(5):
        persistence.changed(f"id-{index + 10}")
        persistence.flush()
        kinds.append(persistence.info()["last_write"]["kind"])
    assert kinds == ["journal", "journal", "journal", "base", "journal"]
    assert persistence.info()["generation"] == info["generation"] + 1
    assert len(os.listdir(tmp_path)) == 2  # the new base and one segment: older files are gone
    # A restarted actor loads what the files say.
    again = FakeActor()
    again.persistence(str(tmp_path)).flush()
    assert sorted(again.restored) == sorted(actor.runs)
    assert again.restored["id-7"].run_status is RunStatus.ERRORED


def test_an_fsspec_store_holds_the_same_layout_and_sets_aside_what_it_cannot_read() -> None:
    """The code path of remote stores (listing, one PUT per file, deletes, moves), on fsspec's memory filesystem."""
    import uuid

    import fsspec

    uri = f"memory://elastrain-state-test-{uuid.uuid4().hex}/state"
    snapshots = Snapshots(Store(uri, timeout_s=30), cluster_id="c1")
    snapshots.write_base(1, [document(1), document(2)])
    snapshots.write_segment(1, 1, [document(3)], removed=["id-1"])
    loaded = snapshots.load()
    assert (sorted(loaded.runs), loaded.cluster_id) == (["id-2", "id-3"], "c1")
    snapshots.write_base(2, [document(2)])
    assert snapshots.store.names() == [base_name(2)]
    fs = fsspec.filesystem("memory")
    fs.pipe_file(f"{uri}/{base_name(3)}", b"not json")
    fallback = snapshots.load()  # the newest base is unreadable: set aside, and the one before it is read
    assert "is not valid JSON" in fallback.problems[0]
    assert (list(fallback.runs), fallback.generation) == (["id-2"], 3)
    assert sorted(name for name in snapshots.store.names() if name.startswith("base-")) == [base_name(2)]
    fs.rm(uri.split("/state")[0], recursive=True)
