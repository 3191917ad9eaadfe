"""The many-writer commit protocol of ``ShardedStatePersistence`` on its own, with no executor and no torch: parts
uploaded from several threads, one manifest that commits them, fencing by step, collection, and what a reader sees
of a checkpoint whose parts are not all in.
"""

from __future__ import annotations

import os
import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from elastrain.durable import CheckpointStore, ShardedStatePersistence, StaleCheckpointError


def write_part(root: Path, rank: int, size: int = 20_000) -> Path:
    """What one rank's DCP writer leaves: a data file or two, named by rank."""
    (root / "nested").mkdir(parents=True)
    (root / f"__{rank}_0.distcp").write_bytes(os.urandom(size))
    (root / "nested" / f"extra-{rank}.bin").write_bytes(os.urandom(100))
    return root


def save(persistence: ShardedStatePersistence, tmp_path: Path, step: int, writers: int = 3) -> str:
    """One checkpoint as the executor writes it: begin on the coordinator, a part per writer in parallel, commit."""
    name = persistence.begin(step)
    sources = [write_part(tmp_path / f"step-{step}" / f"rank-{r}", r) for r in range(writers)]
    with ThreadPoolExecutor(writers) as pool:
        parts = list(pool.map(lambda r: persistence.upload_part(name, f"part-{r:05d}", sources[r]), range(writers)))
    persistence.commit(name, parts, step=step, metrics={"loss": 0.5}, index_files={".metadata": b"index"})
    return name


def test_parts_from_every_writer_commit_as_one_checkpoint(tmp_path: Path) -> None:
    persistence = ShardedStatePersistence(tmp_path / "job", every=5)
    name = save(persistence, tmp_path, step=10)
    assert persistence.latest() == name
    restored = tmp_path / "restored"
    assert persistence.download(name, restored) == 10  # the commit count is the step
    files = {p.relative_to(restored).as_posix() for p in restored.rglob("*") if p.is_file()}
    assert files == {".metadata"} | {
        f"part-{r:05d}/{leaf}" for r in range(3) for leaf in (f"__{r}_0.distcp", f"nested/extra-{r}.bin")
    }
    for r in range(3):
        original = tmp_path / "step-10" / f"rank-{r}" / f"__{r}_0.distcp"
        assert (restored / f"part-{r:05d}" / f"__{r}_0.distcp").read_bytes() == original.read_bytes()
    checkpoint = CheckpointStore(tmp_path / "job").latest()
    assert checkpoint is not None
    assert (checkpoint.step, checkpoint.metrics["loss"]) == (10, 0.5)
    persistence.close()


def test_a_checkpoint_without_its_commit_is_never_latest(tmp_path: Path) -> None:
    persistence = ShardedStatePersistence(tmp_path / "job", every=1)
    committed = save(persistence, tmp_path, step=4)
    name = persistence.begin(8)
    persistence.upload_part(name, "part-00000", write_part(tmp_path / "late", 0))  # the other parts never come
    assert persistence.latest() == committed
    assert CheckpointStore(tmp_path / "job").latest().name == committed  # type: ignore[union-attr]
    persistence.close()


def test_a_former_coordinators_older_step_is_refused(tmp_path: Path) -> None:
    persistence = ShardedStatePersistence(tmp_path / "job", every=1)
    old = persistence.begin(6)  # a coordinator that falls behind ...
    parts = [persistence.upload_part(old, "part-00000", write_part(tmp_path / "old", 0))]
    newer = save(ShardedStatePersistence(tmp_path / "job", every=1), tmp_path, step=9)  # ... while a new one commits
    with pytest.raises(StaleCheckpointError, match="step 9 is already committed"):
        persistence.commit(old, parts, step=6)
    with pytest.raises(StaleCheckpointError):
        persistence.begin(7)
    assert persistence.latest() == newer
    persistence.close()


def test_collection_keeps_the_newest(tmp_path: Path) -> None:
    persistence = ShardedStatePersistence(tmp_path / "job", every=1, num_to_keep=2)
    names = [save(persistence, tmp_path, step=step, writers=2) for step in (1, 2, 3, 4)]
    kept = [c.name for c in CheckpointStore(tmp_path / "job").list()]
    assert kept == names[-2:]
    persistence.close()


def test_it_travels_to_workers_as_settings_only(tmp_path: Path) -> None:
    persistence = ShardedStatePersistence(tmp_path / "job", every=3, num_to_keep=1)
    persistence.begin(1)  # an open store and a begun checkpoint stay behind
    copy = pickle.loads(pickle.dumps(persistence))  # noqa: S301 - our own bytes
    assert (copy.uri, copy.every, repr(copy)) == (persistence.uri, 3, repr(persistence))
    assert (copy.due(6), copy.due(7)) == (True, False)
    assert (copy._store, copy._open) == (None, {})
    persistence.close()


@pytest.mark.parametrize("part", ["", "a/b", ".hidden"])
def test_a_part_is_a_plain_folder_name(tmp_path: Path, part: str) -> None:
    persistence = ShardedStatePersistence(tmp_path / "job")
    with pytest.raises(ValueError, match="plain folder name"):
        persistence.upload_part("x", part, tmp_path)


@pytest.mark.parametrize("every", [0, -1, True, 2.5])
def test_every_is_a_positive_int(tmp_path: Path, every: object) -> None:
    with pytest.raises(ValueError, match="positive int"):
        ShardedStatePersistence(tmp_path / "job", every=every)  # type: ignore[arg-type]


def test_a_reader_downloads_the_index_then_only_the_parts_it_needs(tmp_path: Path) -> None:
    persistence = ShardedStatePersistence(tmp_path / "job", every=1)
    name = save(persistence, tmp_path, step=3)
    folder = tmp_path / "read"
    assert persistence.download(name, folder, parts=()) == 3
    assert [p.name for p in folder.iterdir()] == [".metadata"]
    persistence.download(name, folder, parts=["part-00002"])
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) == [
        ".metadata",
        "part-00002/__2_0.distcp",
        "part-00002/nested/extra-2.bin",
    ]
    with pytest.raises(FileExistsError, match="part-00002"):
        persistence.download(name, folder, parts=["part-00002"])
    persistence.close()


def test_a_part_that_changed_in_the_store_is_refused(tmp_path: Path) -> None:
    from elastrain.durable import CheckpointCorruptedError

    persistence = ShardedStatePersistence(tmp_path / "job", every=1)
    name = save(persistence, tmp_path, step=3)
    (tmp_path / "job" / name / "part-00001" / "__1_0.distcp").write_bytes(b"not what was committed")
    with pytest.raises(CheckpointCorruptedError, match=r"part-00001/__1_0\.distcp"):
        persistence.download(name, tmp_path / "read", parts=["part-00001"])
    persistence.close()
