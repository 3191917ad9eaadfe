"""CheckpointStore on the local disk and memory://: commits, listing, restore, garbage collection, bad input."""

from __future__ import annotations

import asyncio
import json
import math
import os
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import assert_an_uncommit_cut_short_is_finished, make_tree, tree_contents

from elastrain.durable import (
    Checkpoint,
    CheckpointCorruptedError,
    CheckpointNotFoundError,
    CheckpointStore,
    StaleCheckpointError,
)


def manifests(root: Path) -> list[str]:
    folder = root / "_manifests"
    return sorted(os.listdir(folder)) if folder.exists() else []


def data_folders(root: Path) -> list[str]:
    return sorted(name for name in os.listdir(root) if name.startswith("checkpoint_"))


def test_round_trip_keeps_files_metrics_and_step(tmp_path: Path, tree: Path) -> None:
    with CheckpointStore(tmp_path / "store") as store:
        saved = store.save(tree, metrics={"loss": 0.5, "tags": ["a"]}, step=7)
        assert saved.step == 7
        assert saved.metrics == {"loss": 0.5, "tags": ["a"]}
        assert {f.path for f in saved.files} >= {"model/shards/0.bin", "empty.txt"}
        restored = store.restore(local_dir=tmp_path / "out")
    assert restored == saved
    assert tree_contents(tmp_path / "out") == tree_contents(tree)


def test_memory_uri_round_trip(tmp_path: Path, tree: Path) -> None:
    with CheckpointStore(f"memory://elastrain-{uuid.uuid4().hex}") as store:
        store.save(tree, step=1)
        store.restore(local_dir=tmp_path / "out")
    assert tree_contents(tmp_path / "out") == tree_contents(tree)


def test_file_uri_and_plain_path_are_the_same_store(tmp_path: Path, tree: Path) -> None:
    with CheckpointStore(tmp_path / "store") as store:
        saved = store.save(tree)
    with CheckpointStore(f"file://{tmp_path / 'store'}") as again:
        latest = again.latest()
        assert latest is not None
        assert (latest.name, latest.files) == (saved.name, saved.files)


def test_save_async_returns_once_staged_and_commits_in_order(tmp_path: Path, tree: Path) -> None:
    root = tmp_path / "store"
    with CheckpointStore(root) as store:
        futures = [store.save_async(tree, step=step) for step in range(5)]
        (tree / "model" / "config.json").write_text("changed after staging")  # staged copies are private
        committed = [future.result(30) for future in futures]
        assert [c.step for c in committed] == list(range(5))
        assert [c.sequence for c in committed] == sorted(c.sequence for c in committed)
        store.restore(committed[-1], local_dir=tmp_path / "out")
    assert (tmp_path / "out" / "model" / "config.json").read_text() == '{"layers": 2}'


def save_from_threads(store: CheckpointStore, tree: Path, steps: list[int | None]) -> list[Checkpoint | Exception]:
    """Each step saved by its own thread, all started at once; what each got, in the order they finished."""
    outcomes: list[Checkpoint | Exception] = []
    lock = threading.Lock()
    start = threading.Barrier(len(steps))

    def save(step: int | None) -> None:
        start.wait(30)
        try:
            outcome: Checkpoint | Exception = store.save_async(tree, step=step).result(60)
        except Exception as error:  # the outcome is what the test checks
            outcome = error
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=save, args=(step,)) for step in steps]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(outcomes) == len(steps), "a saving thread did not finish in 60 s"
    return outcomes


def test_concurrent_save_async_from_threads_are_serialised(tmp_path: Path, tree: Path) -> None:
    with CheckpointStore(tmp_path / "store") as store:
        outcomes = save_from_threads(store, tree, [None] * 6)
        assert all(isinstance(outcome, Checkpoint) for outcome in outcomes), outcomes
        committed = [outcome for outcome in outcomes if isinstance(outcome, Checkpoint)]
        assert sorted(c.sequence for c in committed) == [c.sequence for c in store.list()]
        assert len({c.name for c in committed}) == 6


def test_concurrent_stepped_saves_commit_ascending_steps_and_refuse_late_ones(tmp_path: Path, tree: Path) -> None:
    # Threads reach the store in any order; one whose step is below a committed one is refused, never reordered.
    with CheckpointStore(tmp_path / "store") as store:
        outcomes = save_from_threads(store, tree, list(range(6)))
        committed = [outcome for outcome in outcomes if isinstance(outcome, Checkpoint)]
        refused = [outcome for outcome in outcomes if not isinstance(outcome, Checkpoint)]
        assert committed, outcomes
        assert all(isinstance(error, StaleCheckpointError) for error in refused), refused
        listed = store.list()
        assert sorted(c.name for c in listed) == sorted(c.name for c in committed)
        steps_in_commit_order = [c.step for c in sorted(listed, key=lambda c: c.sequence)]
        assert steps_in_commit_order == sorted(steps_in_commit_order)


@pytest.mark.parametrize("staging", ["link", "move"])
def test_staging_by_link_or_move(tmp_path: Path, tree: Path, staging: str) -> None:
    expected = tree_contents(tree)
    with CheckpointStore(tmp_path / "store") as store:
        store.save_async(tree, staging=staging).result(30)  # type: ignore[arg-type]
        store.restore(local_dir=tmp_path / "out")
    assert tree_contents(tmp_path / "out") == expected
    assert tree.exists() == (staging == "link")


def test_a_collection_cut_short_is_finished_later(tmp_path: Path, tree: Path) -> None:
    root = tmp_path / "store"
    with CheckpointStore(root) as remembering:
        assert_an_uncommit_cut_short_is_finished(remembering, lambda: CheckpointStore(root), tree, tmp_path)


def test_gc_without_score_keeps_exactly_the_newest(tmp_path: Path, tree: Path) -> None:
    root = tmp_path / "store"
    with CheckpointStore(root, num_to_keep=3) as store:
        for step in range(7):
            store.save(tree, step=step)
        store.wait()
        assert [c.step for c in store.list()] == [4, 5, 6]
    assert len(manifests(root)) == 3
    assert data_folders(root) == manifests(root)


@pytest.mark.parametrize(("order", "kept_steps"), [("max", [1, 3, 5]), ("min", [2, 4, 5])])
def test_gc_with_score_keeps_the_best_and_the_latest(
    tmp_path: Path, tree: Path, order: str, kept_steps: list[int]
) -> None:
    root = tmp_path / "store"
    scores = [1.0, 9.0, 0.5, 8.0, 0.2, float("nan")]  # the latest (NaN) is kept anyway
    with CheckpointStore(root, num_to_keep=3, score_attribute="acc", score_order=order) as store:
        for step, score in enumerate(scores):
            store.save(tree, metrics={"acc": score}, step=step)
        store.wait()
        assert [c.step for c in store.list()] == kept_steps
        best = store.best()
        assert best is not None
        assert best.step == (1 if order == "max" else 4)
    assert len(manifests(root)) == 3
    assert len(data_folders(root)) == 3


def test_missing_and_nan_scores_rank_lowest(tmp_path: Path, tree: Path) -> None:
    with CheckpointStore(tmp_path / "store", num_to_keep=2, score_attribute="loss", score_order="min") as store:
        store.save(tree, metrics={"loss": 0.3}, step=0)
        store.save(tree, metrics={}, step=1)
        store.save(tree, metrics={"loss": math.nan}, step=2)
        store.save(tree, metrics={"loss": 0.9}, step=3)
        store.wait()
        assert [c.step for c in store.list()] == [0, 3]


def test_a_fresh_store_resumes_from_the_latest_commit(tmp_path: Path, tree: Path) -> None:
    with CheckpointStore(tmp_path / "store", num_to_keep=2) as store:
        for step in range(3):
            store.save(tree, step=step)
    with CheckpointStore(tmp_path / "store", num_to_keep=2) as fresh:
        latest = fresh.latest()
        assert latest is not None
        assert latest.step == 2
        later = fresh.save(tree, step=3)
        assert later.sequence > latest.sequence


def test_half_uploaded_checkpoint_is_never_listed_and_is_cleaned_later(tmp_path: Path, tree: Path) -> None:
    root = tmp_path / "store"
    with CheckpointStore(root) as store:
        first = store.save(tree, step=0)
    orphan = root / "checkpoint_000000002_abcdef"  # what a writer that died mid-upload leaves
    make_tree(orphan)
    with CheckpointStore(root) as store:
        assert store.list() == [first]
        assert store.latest() == first
        with pytest.raises(CheckpointNotFoundError):
            store.restore(orphan.name, local_dir=tmp_path / "out")
        store.save(tree, step=1)
        store.wait()
    assert not orphan.exists()


def test_torn_manifest_is_ignored(tmp_path: Path, tree: Path) -> None:
    root = tmp_path / "store"
    with CheckpointStore(root) as store:
        first = store.save(tree, step=0)
        second = store.save(tree, step=1)
    (root / "_manifests" / second.name / "MANIFEST.json").write_text('{"format": 1, "na')
    with CheckpointStore(root) as store:
        assert store.list() == [first]


def test_corrupted_file_fails_restore_unless_fallback(tmp_path: Path, tree: Path) -> None:
    root = tmp_path / "store"
    with CheckpointStore(root) as store:
        first = store.save(tree, step=0)
        second = store.save(tree, step=1)
        shard = root / second.name / "model" / "shards" / "0.bin"
        data = bytearray(shard.read_bytes())
        data[100] ^= 0xFF
        shard.write_bytes(bytes(data))
        with pytest.raises(CheckpointCorruptedError, match=r"0\.bin fails its SHA-256"):
            store.restore(local_dir=tmp_path / "out")
        assert not (tmp_path / "out").exists()
        assert store.restore(local_dir=tmp_path / "out", fallback=True) == first
    assert tree_contents(tmp_path / "out") == tree_contents(tree)


def test_missing_or_truncated_file_fails_restore(tmp_path: Path, tree: Path) -> None:
    root = tmp_path / "store"
    with CheckpointStore(root) as store:
        saved = store.save(tree)
        (root / saved.name / "optimizer.pt").write_bytes(b"short")
        with pytest.raises(CheckpointCorruptedError, match=r"optimizer\.pt has 5 bytes"):
            store.restore(local_dir=tmp_path / "a")
        (root / saved.name / "optimizer.pt").unlink()
        with pytest.raises(CheckpointCorruptedError, match="missing"):
            store.restore(local_dir=tmp_path / "b")


def test_gc_never_deletes_what_a_restore_is_reading(tmp_path: Path, tree: Path) -> None:
    root = tmp_path / "store"
    with CheckpointStore(root, num_to_keep=1) as store:
        first = store.save(tree, step=0)
        with store._readers.reading(first.name, lease_s=60):  # a restore in progress
            store.save(tree, step=1)
            store.wait()
            assert (root / first.name).exists()
            assert [c.step for c in store.list()] == [1]  # due for collection: no longer listed
        store.save(tree, step=2)
        store.wait()
        assert not (root / first.name).exists()
        assert len(data_folders(root)) == 1


def test_gc_respects_leases_of_readers_in_other_processes(tmp_path: Path, tree: Path) -> None:
    root = tmp_path / "store"
    with CheckpointStore(root, num_to_keep=1) as store:
        first = store.save(tree, step=0)
        (root / "_readers").mkdir()
        lease = root / "_readers" / f"{first.name}.other-process.json"
        lease.write_text(json.dumps({"expires_at": time.time() + 600}))
        store.save(tree, step=1)
        store.wait()
        assert (root / first.name).exists()  # another process is reading it
        lease.write_text(json.dumps({"expires_at": time.time() - 1}))  # its reader died
        store.save(tree, step=2)
        store.wait()
        assert not (root / first.name).exists()
        assert not lease.exists()  # the expired lease went too
        assert len(data_folders(root)) == 1


def test_restore_async_and_awaitable_futures(tmp_path: Path, tree: Path) -> None:
    async def main() -> Checkpoint:
        with CheckpointStore(tmp_path / "store") as store:
            future = await store.asave(tree, step=3)
            committed = await future
            restored = await store.arestore(local_dir=tmp_path / "out")
            assert restored == committed
            return committed

    assert asyncio.run(main()).step == 3
    assert tree_contents(tmp_path / "out") == tree_contents(tree)


def test_manifest_records_sizes_checksums_and_time(tmp_path: Path, tree: Path) -> None:
    root = tmp_path / "store"
    with CheckpointStore(root) as store:
        saved = store.save(tree, metrics={"loss": 1.5}, step=2)
    document = json.loads((root / "_manifests" / saved.name / "MANIFEST.json").read_text())
    assert document["step"] == 2
    assert document["metrics"] == {"loss": 1.5}
    assert document["created_at"] > 0
    sizes = {entry["path"]: entry["size"] for entry in document["files"]}
    assert sizes["empty.txt"] == 0
    assert sizes["model/shards/0.bin"] == 300_000
    assert all(len(entry["sha256"]) == 64 for entry in document["files"])


# -- bad input -------------------------------------------------------------------------------------------------


def test_unknown_scheme_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"Unknown storage scheme 'nosuch'.*s3"):
        CheckpointStore("nosuch://bucket/run")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_to_keep": 0}, "num_to_keep must be at least 1"),
        ({"num_to_keep": 2.5}, "num_to_keep must be a positive int"),
        ({"score_order": "up"}, "score_order must be 'max' or 'min'"),
        ({"timeout_s": 0}, "timeout_s must be positive"),
        ({"retries": -1}, "retries must be a non-negative int"),
    ],
)
def test_bad_options_are_clear(tmp_path: Path, options: dict[str, object], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        CheckpointStore(tmp_path / "store", **options)  # type: ignore[arg-type]


def test_unwritable_store_folder(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("in the way")
    with pytest.raises(PermissionError, match="choose a writable folder"):
        CheckpointStore(tmp_path / "a-file" / "store")
    with pytest.raises(PermissionError, match="choose a writable folder"):
        CheckpointStore("/proc/elastrain-store")  # not writable even for root


def test_unwritable_restore_folder(tmp_path: Path, tree: Path) -> None:
    with CheckpointStore(tmp_path / "store") as store:
        store.save(tree)
        with pytest.raises(PermissionError, match="choose a writable folder"):
            store.restore(local_dir="/proc/elastrain-restore/out")


def test_bad_save_and_restore_arguments(tmp_path: Path, tree: Path) -> None:
    with CheckpointStore(tmp_path / "store", num_to_keep=1) as store:
        with pytest.raises(NotADirectoryError, match="folder of checkpoint files"):
            store.save(tmp_path / "missing")
        with pytest.raises(TypeError, match="JSON-serializable"):
            store.save(tree, metrics={"loss": object()})
        with pytest.raises(ValueError, match="staging must be one of"):
            store.save_async(tree, staging="symlink")  # type: ignore[arg-type]
        with pytest.raises(CheckpointNotFoundError, match="No committed checkpoint"):
            store.restore(local_dir=tmp_path / "out")
        store.save(tree)
        (tmp_path / "full").mkdir()
        (tmp_path / "full" / "x").write_text("x")
        with pytest.raises(FileExistsError, match="new or empty folder"):
            store.restore(local_dir=tmp_path / "full")
        with pytest.raises(ValueError, match="score_attribute"):
            store.best()
    with pytest.raises(RuntimeError, match="closed"):
        store.save(tree)


def test_writers_taking_turns_never_reuse_or_reorder_sequences(tmp_path: Path, tree: Path) -> None:
    """Elastic state is persisted by whichever worker is rank 0: the store looks up the sequence at every save."""
    root = tmp_path / "store"
    with CheckpointStore(root, num_to_keep=2) as first, CheckpointStore(root, num_to_keep=2) as second:
        first.save(tree, step=1)
        second.save(tree, step=2)
        third = first.save(tree, step=3)
        first.wait()
        second.wait()
        latest = first.latest()
        assert latest is not None
        assert latest.name == third.name
        assert [c.step for c in second.list()] == [2, 3]
