"""Elastic recovery on a real multi-node ray.cluster_utils.Cluster: killed workers and a lost node.

The model is a deterministic linear regression whose every step's update is the same whatever the world size
(each rank takes a shard of the step's batch; gradients are summed). So the final weights of a job that
survived failures must equal those of one trained without failures: nothing committed was lost and nothing
applied twice.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from elastrain.executor import RayExecutor, elastic, send
from elastrain_testutils.ray_testing import NODE_DEFAULTS, local_cluster
from elastrain_testutils.waiting import wait_until

pytestmark = pytest.mark.cluster

W_TRUE = (1.0, -2.0, 3.0, 0.5)
BATCH = 8
LR = 0.05
MOMENTUM = 0.9


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_cluster({"num_cpus": 2}, {"num_cpus": 2}) as cluster:
        yield cluster


def make_model() -> tuple[Any, Any]:
    import torch

    model = torch.nn.Linear(4, 1, bias=False, dtype=torch.float64)
    torch.nn.init.zeros_(model.weight)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    return model, optimizer


def step_batch(step: int) -> tuple[Any, Any]:
    """The batch of one step: the same on every worker and in the reference."""
    import torch

    generator = torch.Generator().manual_seed(step)
    inputs = torch.randn(BATCH, 4, generator=generator, dtype=torch.float64)
    return inputs, inputs @ torch.tensor(W_TRUE, dtype=torch.float64)


def reference(steps: int) -> list[float]:
    model, optimizer = make_model()
    for step in range(steps):
        inputs, targets = step_batch(step)
        optimizer.zero_grad()
        ((model(inputs).squeeze(1) - targets) ** 2).sum().div(BATCH).backward()
        optimizer.step()
    return [float(v) for v in model.weight.detach().flatten()]


def train_model(steps: int, step_sleep_s: float, stop_file: str | None = None) -> list[float]:
    """``stop_file``, once it exists, holds the step to end at instead of ``steps`` (written well ahead)."""
    import os

    import torch.distributed as dist

    model, optimizer = make_model()
    state = elastic.TorchState(model=model, optimizer=optimizer, step=0)

    def last_step() -> int:
        if stop_file is not None and os.path.exists(stop_file):
            with open(stop_file) as reader:
                return int(reader.read())
        return steps

    @elastic.run
    def train(state: elastic.TorchState) -> list[float]:
        while state.step < last_step():
            rank, size = dist.get_rank(), dist.get_world_size()
            inputs, targets = step_batch(state.step)
            optimizer.zero_grad()
            shard = ((model(inputs[rank::size]).squeeze(1) - targets[rank::size]) ** 2).sum().div(BATCH)
            shard.backward()
            for parameter in model.parameters():
                dist.all_reduce(parameter.grad)
            optimizer.step()
            state.step += 1
            send({"event": "step", "step": state.step, "size": size})
            time.sleep(step_sleep_s)
            state.commit()
        return [float(v) for v in model.weight.detach().flatten()]

    return train(state)


def executor(**kwargs: Any) -> RayExecutor:
    settings = RayExecutor.create_settings(timeout_s=60, discovery_interval_s=0.1)
    return RayExecutor(settings, min_workers=1, max_workers=2, elastic_timeout=120, **kwargs)


def test_five_worker_kills_in_a_row_lose_nothing(cluster: Any, tmp_path: Path) -> None:
    import ray

    steps = 100_000  # ended by the stop file once the kills are done, however long recoveries take
    stop_file = tmp_path / "stop"
    last_step: list[int] = []
    kills: list[int] = []
    wanted_kills = 5
    lock = threading.Lock()
    steps_since_full = [0]
    ex = executor(cpus_per_worker=1)

    def on_message(message: dict[str, Any]) -> None:
        with lock:
            if message["size"] < 2:
                steps_since_full[0] = 0
                return
            steps_since_full[0] += 1
            if len(kills) == wanted_kills and steps_since_full[0] >= 10 and not last_step:
                last_step.append(message["step"] + 100)
                (tmp_path / "stop.tmp").write_text(str(last_step[0]))
                os.replace(tmp_path / "stop.tmp", stop_file)
            # Kill again once the replacement of the last victim joined and a few steps ran at full size.
            if len(kills) < wanted_kills and steps_since_full[0] >= 10:
                session = ex._elastic
                driver = session.driver if session is not None else None
                actors = driver.actors() if driver is not None else {}
                if len(actors) == 2:
                    ray.kill(random.choice(list(actors.values())))
                    kills.append(message["step"])
                    steps_since_full[0] = 0

    with ex:
        ex.start()
        results = ex.run(train_model, args=[steps, 0.02, str(stop_file)], callbacks=[on_message])
        stats = ex._elastic.last_stats  # type: ignore[union-attr]
    assert len(kills) == wanted_kills
    assert stats is not None
    assert stats.resets >= wanted_kills
    expected = reference(last_step[0])
    assert results, "no worker finished"
    for weights in results:
        assert weights == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_node_removed_and_added_back(cluster: Any) -> None:
    steps = 600
    sizes: list[int] = []
    full_size_running = threading.Event()
    shrunk = threading.Event()

    def on_message(message: dict[str, Any]) -> None:
        sizes.append(message["size"])
        if message["size"] == 2 and message["step"] > 20:
            full_size_running.set()
        if message["size"] == 1:
            shrunk.set()

    # One worker per node (2 CPUs each), so removing a node removes one worker. Ray's Cluster must be changed
    # from the main thread, so the job runs in another one.
    with executor(cpus_per_worker=2) as ex, ThreadPoolExecutor(1) as pool:
        ex.start()
        job = pool.submit(ex.run, train_model, [steps, 0.02], None, [on_message])
        assert full_size_running.wait(60)
        cluster.remove_node(cluster.list_all_nodes()[-1])  # never the head: it holds the control plane
        assert shrunk.wait(60)
        cluster.add_node(num_cpus=2, **NODE_DEFAULTS)
        results = job.result(timeout=300)
    assert 1 in sizes
    assert sizes[-1] == 2, "the worker on the new node never joined"
    for weights in results:
        assert weights == pytest.approx(reference(steps), rel=1e-9, abs=1e-12)


def test_a_worker_lost_with_its_node_is_counted_dead_by_the_roll_call(
    cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A hard node loss: Ray tells of the lost worker only seconds later, but its peer reports the failed group
    and the lost worker does not answer the roll call, so the job goes on without waiting for Ray."""
    import ray

    steps = 400
    shrunk = threading.Event()
    full_size_running = threading.Event()

    def on_message(message: dict[str, Any]) -> None:
        if message["size"] == 2 and message["step"] > 20:
            full_size_running.set()
        if message["size"] == 1:
            shrunk.set()

    with (
        caplog.at_level("WARNING", logger="elastrain.executor"),
        executor(cpus_per_worker=2) as ex,
        ThreadPoolExecutor(1) as pool,
    ):
        ex.start()
        job = pool.submit(ex.run, train_model, [steps, 0.02], None, [on_message])
        assert full_size_running.wait(60)
        removed = cluster.list_all_nodes()[-1]
        cluster.remove_node(removed, allow_graceful=False)
        assert shrunk.wait(60)
        cluster.add_node(num_cpus=2, **NODE_DEFAULTS)
        results = job.result(timeout=300)
    # The next test must not meet the removed node, which Ray declares dead only some seconds after a hard loss.
    wait_until(
        lambda: not any(n["NodeID"] == removed.node_id and n["Alive"] for n in ray.nodes()),
        timeout_s=60,
        what="Ray to declare the removed node dead",
    )
    assert any("did not answer within" in record.getMessage() for record in caplog.records), [
        record.getMessage() for record in caplog.records
    ]
    for weights in results:
        assert weights == pytest.approx(reference(steps), rel=1e-9, abs=1e-12)


def test_a_joining_node_gets_the_spare_worker_before_discovery_polls(cluster: Any) -> None:
    """Below max_workers with every slot taken, a worker request waits for Ray to place it on a new node."""
    steps = 400
    joined = threading.Event()
    running = threading.Event()
    sizes: list[int] = []

    def on_message(message: dict[str, Any]) -> None:
        sizes.append(message["size"])
        if message["step"] > 20:
            running.set()
        if message["size"] == 3:
            joined.set()

    # Discovery polls once a minute: only the spare can notice the new node in time.
    settings = RayExecutor.create_settings(timeout_s=60, discovery_interval_s=60)
    ex = RayExecutor(settings, min_workers=1, max_workers=3, cpus_per_worker=2, elastic_timeout=120)
    with ex, ThreadPoolExecutor(1) as pool:
        ex.start()
        job = pool.submit(ex.run, train_model, [steps, 0.02], None, [on_message])
        assert running.wait(60)
        added_at = time.monotonic()
        cluster.add_node(num_cpus=2, **NODE_DEFAULTS)
        assert joined.wait(45), "the spare worker never joined from the new node"
        assert time.monotonic() - added_at < 45
        results = job.result(timeout=300)
        stats = ex._elastic.last_stats  # type: ignore[union-attr]
    assert stats is not None
    assert stats.spares_used == 1
    assert sizes[-1] == 3
    for weights in results:
        assert weights == pytest.approx(reference(steps), rel=1e-9, abs=1e-12)
