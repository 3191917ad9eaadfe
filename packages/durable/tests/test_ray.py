"""Inside Ray: async actors checkpoint without blocking their event loop; elastic jobs persist and resume state."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import make_tree

from elastrain.durable import CheckpointStore, CommandSyncClient, StatePersistence
from elastrain_testutils.ray_testing import local_ray, ship_by_value

# Uploads through this client take two seconds: long enough to see whether anything waits on them.
SLOW_SYNC = 'sh -c \'sleep 2; mkdir -p "$1" && cp -R "$0"/. "$1"\' {source} {target}'
SYNC = 'sh -c \'mkdir -p "$1" && if [ -d "$0" ]; then cp -R "$0"/. "$1"; fi\' {source} {target}'


@pytest.fixture(scope="module", autouse=True)
def ray_local(request: pytest.FixtureRequest) -> Iterator[None]:
    ship_by_value(request.module)
    with local_ray(num_cpus=4):
        yield


def test_async_actor_event_loop_keeps_running_while_saving(tmp_path: Path) -> None:
    import ray

    @ray.remote(num_cpus=0.25)
    class Trainer:
        def __init__(self, uri: str) -> None:
            client = CommandSyncClient(sync_up=SLOW_SYNC, sync_down=SYNC, delete="rm -rf {target}")
            self.store = CheckpointStore(uri, sync_client=client)

        async def checkpoint(self, folder: str) -> tuple[float, float]:
            started = time.monotonic()
            future = await self.store.asave(folder, step=1)
            staged = time.monotonic() - started
            await future
            return staged, time.monotonic() - started

        async def restore(self, folder: str) -> int | None:
            return (await self.store.arestore(local_dir=folder)).step

        async def ping(self) -> float:
            return time.monotonic()

    folder = make_tree(tmp_path / "tree")
    trainer = Trainer.remote(str(tmp_path / "store"))  # type: ignore[attr-defined]
    ray.get(trainer.ping.remote(), timeout=60)
    saving = trainer.checkpoint.remote(str(folder))
    time.sleep(0.5)
    started = time.monotonic()
    ray.get(trainer.ping.remote(), timeout=10)
    assert time.monotonic() - started < 1.0  # answered while the upload was still running
    staged, committed = ray.get(saving, timeout=60)
    assert staged < 1.0 <= 2.0 <= committed
    assert ray.get(trainer.restore.remote(str(tmp_path / "out")), timeout=60) == 1
    ray.kill(trainer)


def train_with_persistence(target_step: int, persistence: StatePersistence) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from elastrain.executor import elastic

    state = elastic.ObjectState(step=0, total=0.0)
    state.persist_with(persistence)
    first: dict[str, int] = {}

    @elastic.run
    def train(state: elastic.ObjectState) -> dict[str, Any]:
        first.setdefault("step", state.step)
        while state.step < target_step:
            value = torch.tensor([float(state.step + 1)])
            dist.all_reduce(value)
            state.total += value.item()
            state.step += 1
            state.commit()
        return {"first_step": first["step"], "step": state.step, "total": state.total}

    result: dict[str, Any] = train(state)
    return result


def test_elastic_state_is_persisted_and_a_fresh_job_resumes(tmp_path: Path) -> None:
    from elastrain.executor import RayExecutor

    uri = str(tmp_path / "job-state")
    persistence = StatePersistence(uri, every=5, num_to_keep=2)
    settings = RayExecutor.create_settings(timeout_s=60)

    def run(target_step: int) -> list[dict[str, Any]]:
        with RayExecutor(settings, min_workers=2, max_workers=2, cpus_per_worker=0.5) as executor:
            executor.start()
            results: list[dict[str, Any]] = executor.run(train_with_persistence, args=[target_step, persistence])
            return results

    first = run(12)
    assert [r["step"] for r in first] == [12, 12]
    assert [r["first_step"] for r in first] == [0, 0]
    with CheckpointStore(uri) as store:
        kept = store.list()
        assert [c.step for c in kept] == [5, 10]  # every 5 commits, two kept
    second = run(20)  # a new job on the same URI starts from commit 10, not from scratch
    assert [r["first_step"] for r in second] == [10, 10]
    expected = sum(2.0 * (step + 1) for step in range(20))
    assert [r["total"] for r in second] == [expected, expected]


def test_state_persistence_checks_its_options(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="every must be a positive int"):
        StatePersistence(tmp_path / "s", every=0)
    with pytest.raises(ValueError, match="num_to_keep must be at least 1"):
        StatePersistence(tmp_path / "s", num_to_keep=0)


class _Counted:
    """Stands in for an elastic state: what StatePersistence.committed reads."""

    def __init__(self, commits: int, value: str) -> None:
        self.commit_count = commits
        self.value = value

    def snapshot(self) -> dict[str, str]:
        return {"value": self.value}


def test_prefetch_loads_the_latest_state_once_and_load_takes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "persisted")
    writer = StatePersistence(uri, every=1, num_to_keep=2)
    writer.committed(_Counted(3, "third"))
    writer.close()
    reader = StatePersistence(uri, every=1)
    restores: list[object] = []
    original = CheckpointStore.restore

    def counting(self: CheckpointStore, *args: Any, **kwargs: Any) -> Any:
        restores.append(args)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(CheckpointStore, "restore", counting)
    reader.prefetch()
    reader.prefetch()  # a second call starts nothing more
    name = reader.latest()
    assert name is not None
    assert reader.load(name) == ({"value": "third"}, 3)
    assert len(restores) == 1  # the prefetched copy, not a second download
    assert reader.load(name) == ({"value": "third"}, 3)  # used once: a later load reads again
    assert len(restores) == 2
    reader.close()


def test_a_prefetch_of_another_checkpoint_is_not_used(tmp_path: Path) -> None:
    uri = str(tmp_path / "persisted")
    writer = StatePersistence(uri, every=1, num_to_keep=3)
    writer.committed(_Counted(1, "first"))
    writer.flush()
    reader = StatePersistence(uri, every=1)
    reader.prefetch()
    first = reader.latest()
    writer.committed(_Counted(2, "second"))  # a newer one lands after the prefetch began
    writer.close()
    newest = reader.latest()
    assert newest is not None
    assert newest != first
    assert reader.load(newest) == ({"value": "second"}, 2)
    reader.close()
