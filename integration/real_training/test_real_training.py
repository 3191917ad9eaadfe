"""Horovod's two elastic PyTorch examples, ported to elastrain, train for real (scikit-learn's digits): once
uninterrupted, once with a worker killed mid-epoch that the survivor outlives alone until a replacement joins.

From what the workers report after each step: every sample of every epoch trains (repeats only as a split's
padding), every step's ranks hold identical parameters and the learning rate the reset callback sets, no world
goes back before the last commit (the Ray example commits every other batch: the step it had not committed is
trained again, once), and the interrupted run ends as accurate as the uninterrupted one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import digits_harness
import pytest
import pytorch_mnist_elastic
import pytorch_ray_elastic

from elastrain.executor import RayExecutor
from elastrain_testutils.ray_testing import local_ray, ship_by_value

for _module in (digits_harness, pytorch_mnist_elastic, pytorch_ray_elastic):
    ship_by_value(_module)

EPOCHS = 8
BATCH = 8  # per worker: 75 steps an epoch on 2 workers, 150 alone (time enough for a replacement to join)
LR = 0.025  # per worker; the ports scale it by the world size
ACCURACY_NOISE = 0.05  # the runs differ in batches and dropout after the crash: simulated apart by 0.012 (sd)


@dataclass(frozen=True)
class Port:
    name: str
    fn: Callable[..., float]
    args: Callable[[list[str]], list[Any]]  # the function's arguments, from a command line
    commit_every: int = 1  # batches per commit
    crash_batch: int = 40  # rank 1 exits hard at this batch of epoch 1 (of 75)

    @property
    def argv(self) -> list[str]:
        argv = ["--epochs", str(EPOCHS), "--batch-size", str(BATCH), "--lr", str(LR)]
        return argv + (["--num-batches-per-commit", str(self.commit_every)] if self.commit_every > 1 else [])

    @property
    def redone(self) -> int:
        """Steps the survivor does again: those after the last commit before the crash."""
        return self.crash_batch % self.commit_every


PORTS = [
    # horovodrun ran the whole script on every worker: its body is main(argv). A commit after every batch.
    Port("pytorch_mnist_elastic", pytorch_mnist_elastic.main, lambda argv: [argv]),
    # The Ray example's train_fn reads the parsed arguments. It commits every other batch: batch 40 is trained
    # but not committed when rank 1 dies at batch 41, so the survivor rolls back and trains it again, alone.
    Port(
        "pytorch_ray_elastic",
        pytorch_ray_elastic.train_fn,
        lambda argv: [pytorch_ray_elastic.parser.parse_args(argv)],
        commit_every=2,
        crash_batch=41,
    ),
]


@dataclass
class Run:
    records: list[dict[str, Any]]
    accuracies: list[float]

    def worlds(self) -> list[list[dict[str, Any]]]:
        """Each world's step records, the worlds in the order they formed."""
        by_world: dict[str, list[dict[str, Any]]] = {}
        for record in self.records:
            by_world.setdefault(record["world"], []).append(record)
        return sorted(by_world.values(), key=lambda records: min(r["time"] for r in records))


@pytest.fixture(scope="module", autouse=True)
def ray_2_cpus() -> Iterator[None]:
    with local_ray(num_cpus=2):
        yield


def train(port: Port, crash_dir: Path | None = None) -> Run:
    argv = port.argv
    if crash_dir is not None:
        argv += ["--crash-dir", str(crash_dir)]
    records: list[dict[str, Any]] = []
    lock = threading.Lock()

    def collect(message: dict[str, Any]) -> None:
        with lock:
            records.append(message)

    settings = RayExecutor.create_settings(timeout_s=60, discovery_interval_s=0.2)
    with RayExecutor(settings, min_workers=1, max_workers=2, cpus_per_worker=0.5, elastic_timeout=120) as executor:
        executor.start()
        accuracies = executor.run(port.fn, args=port.args(argv), callbacks=[collect])
    return Run(records, accuracies)


def check_training(run: Run, commit_every: int) -> dict[str, Any]:
    """The checks every run passes; returns what it saw (resets, padding, steps redone)."""
    worlds = run.worlds()
    start = min(r["time"] for r in run.records)
    for world in worlds:
        assert len({r["size"] for r in world}) == 1, f"one world, several sizes: {world[0]['world']}"
    # Every record: the learning rate the reset callback (or the initial scaling) sets for that world.
    for record in run.records:
        assert record["lr"] == pytest.approx(LR * record["size"], rel=1e-12), record

    # A step is (epoch, samples of the epoch trained before it): the same step whatever the world size, where
    # state.batch restarts at 0 after every reset. Keep the last world that ran each one (a step rolled back and
    # redone in a newer world counts once).
    steps: dict[tuple[int, int], list[dict[str, Any]]] = {}
    redone = 0
    for order, world in enumerate(worlds):
        earlier = [key for other in worlds[:order] for key in _keys(other)]
        mine = sorted(_keys(world))
        if earlier:
            # Never back before the last commit: only steps trained since it are done again.
            behind = [key for key in earlier if key >= mine[0]]
            assert len(behind) < commit_every, f"world {order} restarted at {mine[0]}, before {behind}"
            redone += len(behind)
        for key in mine:
            ranks = [r for r in world if _key(r) == key]
            assert len({r["checksum"] for r in ranks}) == 1, f"step {key}: parameters differ between ranks"
            assert len({r["batch"] for r in ranks}) == 1, f"step {key}: ranks at different batches"
            steps[key] = ranks  # a newer world replaces an older one's
    for key, ranks in steps.items():
        # Every rank of the world that ran the step reported it (a worker that died after a step it never
        # committed may not have: that step is done again, by a newer world).
        assert sorted(r["rank"] for r in ranks) == list(range(ranks[0]["size"])), f"step {key}: ranks {ranks}"

    padding = {}
    for epoch in range(1, EPOCHS + 1):
        keys = sorted(key for key in steps if key[0] == epoch)
        assert keys, f"epoch {epoch} never trained"
        # The steps tile the epoch: each starts where the one before it ended.
        done = 0
        for key in keys:
            assert key[1] == done, f"epoch {epoch}: step {key} does not start where the last ended ({done})"
            done = steps[key][0]["done"]
        trained = [i for key in keys for r in steps[key] for i in r["indices"]]
        assert set(trained) == set(range(digits_harness.TRAIN_SIZE)), f"epoch {epoch} missed samples"
        # Repeats only as padding: each split of the epoch over a world pads it to a multiple of the world size.
        splits = {steps[key][0]["world"]: steps[key][0]["size"] for key in keys}
        padding[epoch] = len(trained) - digits_harness.TRAIN_SIZE
        assert padding[epoch] <= sum(size - 1 for size in splits.values()), f"epoch {epoch}: {padding[epoch]} repeats"

    assert len(run.accuracies) == worlds[-1][0]["size"], run.accuracies
    assert len(set(run.accuracies)) == 1, f"ranks disagree on the averaged accuracy: {run.accuracies}"
    assert run.accuracies[0] > 0.8, run.accuracies
    return {
        "sizes": [world[0]["size"] for world in worlds],
        # Each world: its first and last step, how many it ran, and when (s since the first step).
        "worlds": [
            (
                min(_keys(world)),
                max(_keys(world)),
                len(_keys(world)),
                round(min(r["time"] for r in world) - start, 1),
                round(max(r["time"] for r in world) - start, 1),
            )
            for world in worlds
        ],
        "padding": {epoch: count for epoch, count in padding.items() if count},
        "redone": redone,
    }


def _key(record: dict[str, Any]) -> tuple[int, int]:
    return record["epoch"], record["done"] - BATCH * record["size"]


def _keys(world: list[dict[str, Any]]) -> set[tuple[int, int]]:
    return {_key(r) for r in world}


@pytest.fixture(scope="module", params=PORTS, ids=[port.name for port in PORTS])
def port(request: pytest.FixtureRequest) -> Port:
    port: Port = request.param
    return port


@pytest.fixture(scope="module")
def uninterrupted(port: Port) -> Run:
    return train(port)


def test_uninterrupted_run(port: Port, uninterrupted: Run) -> None:
    seen = check_training(uninterrupted, port.commit_every)
    assert seen["sizes"] == [2], f"a run with nothing killed reset: worlds of sizes {seen['sizes']}"
    print(f"uninterrupted: accuracy {uninterrupted.accuracies[0]:.4f}, {seen}")


def test_killed_worker_is_replaced(port: Port, uninterrupted: Run, tmp_path: Path) -> None:
    crash = tmp_path / f"crash-1-1-{port.crash_batch}"
    crash.touch()
    run = train(port, crash_dir=tmp_path)
    assert not crash.exists(), "the crash never happened"
    seen = check_training(run, port.commit_every)
    # 2 workers, the survivor alone, then 2 again with the replacement (which Ray's discovery started).
    sizes = seen["sizes"]
    assert sizes[:2] == [2, 1], f"the survivor did not go on alone: worlds of sizes {sizes}"
    assert 2 in sizes[2:], f"no replacement joined: worlds of sizes {sizes}"
    worlds = run.worlds()
    killed = {r["pid"] for r in worlds[0] if r["rank"] == 1}
    survivor = {r["pid"] for r in worlds[1]}
    assert killed.isdisjoint(r["pid"] for world in worlds[1:] for r in world)
    assert {r["pid"] for r in worlds[-1]} - survivor, "the last world has no new worker"
    # The survivor goes on from the last commit before the crash, mid-epoch 1.
    last_commit = port.crash_batch - port.redone
    assert min(_keys(worlds[1])) == (1, last_commit * BATCH * 2), seen["worlds"]
    assert seen["redone"] == port.redone, seen
    accuracy, baseline = run.accuracies[0], uninterrupted.accuracies[0]
    assert abs(accuracy - baseline) <= ACCURACY_NOISE, f"accuracy {accuracy:.4f}, uninterrupted {baseline:.4f}"
    print(f"interrupted: accuracy {accuracy:.4f} (uninterrupted {baseline:.4f}), resets {len(sizes) - 1}, {seen}")
