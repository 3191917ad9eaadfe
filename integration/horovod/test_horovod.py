"""The Horovod backend as a Horovod user runs it: a static job with ``hvd.DistributedOptimizer``, and elastic
``hvd.elastic.run`` jobs on this one machine with no NIC setting."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from elastrain.executor import RayExecutor, send
from elastrain_testutils.ray_testing import local_ray


@pytest.fixture(scope="module", autouse=True)
def ray_4_cpus() -> Iterator[None]:
    with local_ray(num_cpus=4):
        yield


def horovod_regression(steps: int) -> tuple[list[float], float, float]:
    import horovod.torch as hvd
    import torch

    hvd.init()
    torch.manual_seed(hvd.rank())  # different starting weights: the broadcast must make them equal
    model = torch.nn.Linear(4, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    generator = torch.Generator().manual_seed(100 + hvd.rank())
    losses = []
    for _ in range(steps):
        inputs = torch.randn(32, 4, generator=generator)
        loss = torch.nn.functional.mse_loss(model(inputs), inputs.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    return [float(v) for v in model.weight.detach().flatten()], losses[0], losses[-1]


def test_static_job_trains_with_distributed_optimizer() -> None:
    settings = RayExecutor.create_settings(timeout_s=60)
    with RayExecutor(settings, num_workers=2, cpus_per_worker=1, backend="horovod") as executor:
        executor.start()
        results = executor.run(horovod_regression, args=[60])
    (weights_0, first_0, last_0), (weights_1, _, _) = results
    assert weights_0 == pytest.approx(weights_1)  # averaged gradients keep the replicas identical
    assert last_0 < first_0 / 10


def horovod_elastic(steps: int, crash_marker: str) -> tuple[int, int]:
    import horovod.torch as hvd
    import torch

    hvd.init()
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = hvd.elastic.TorchState(model, optimizer, step=0)

    @hvd.elastic.run
    def train(state: Any) -> tuple[int, int]:
        while state.step < steps:
            if state.step == 30 and hvd.rank() == 1 and os.path.exists(crash_marker):
                os.remove(crash_marker)
                os._exit(1)
            total = hvd.allreduce(torch.ones(1), op=hvd.Sum)
            send({"step": int(state.step), "size": hvd.size(), "total": float(total.item())})
            state.step += 1
            time.sleep(0.05)
            state.commit()
        return int(state.step), hvd.size()

    return train(state)


def run_elastic(crash_marker: Path, steps: int) -> tuple[list[Any], list[dict[str, Any]]]:
    messages: list[dict[str, Any]] = []
    settings = RayExecutor.create_settings(timeout_s=60)
    # Hosts come from RayHostDiscovery on this one machine, with no NIC setting (Horovod alone needs nics={"lo"}).
    executor = RayExecutor(
        settings, min_workers=1, max_workers=2, cpus_per_worker=1, elastic_timeout=120, backend="horovod"
    )
    with executor:
        executor.start()
        results = executor.run(horovod_elastic, args=[steps, str(crash_marker)], callbacks=[messages.append])
    return results, messages


def test_elastic_job_on_one_machine_without_a_nic_setting(tmp_path: Path) -> None:
    results, messages = run_elastic(tmp_path / "no-crash", steps=60)
    assert results == [(60, 2), (60, 2)]
    assert messages
    assert all(m["total"] == m["size"] == 2 for m in messages)


def test_a_worker_crash_under_horovods_elastic_loop_ends_the_job_clearly(tmp_path: Path) -> None:
    """Horovod's own elastic driver ends the job when a worker process exits (the torch backend recovers in
    place instead): the caller gets Horovod's error at once, never a hang."""
    marker = tmp_path / "crash"
    marker.touch()
    with ThreadPoolExecutor(1) as pool:
        job = pool.submit(run_elastic, marker, 100)
        with pytest.raises(RuntimeError, match="exited with non-zero status"):
            job.result(timeout=120)  # a hang fails here, not at the suite's timeout
    assert not marker.exists(), "the crash never happened"
