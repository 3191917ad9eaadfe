"""The horovod backend's elastic path: ``hvd.elastic.run`` code under Horovod's own elastic machinery, on one
machine without any NIC setting, with scripted discovery and elastrain callbacks."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from elastrain.discovery import StaticHostDiscovery
from elastrain.executor import RayExecutor, send
from elastrain_testutils.ray_testing import local_ray


@pytest.fixture(scope="module", autouse=True)
def ray_with_scripted_hosts() -> Iterator[None]:
    with local_ray(num_cpus=4, resources={"node:host-1": 100, "node:host-2": 100}):
        yield


def horovod_training(steps: int) -> tuple[int, int]:
    import horovod.torch as hvd
    import torch

    hvd.init()
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    send({"event": "started"})

    @hvd.elastic.run
    def train(state: Any) -> tuple[int, int]:
        while state.step < steps:
            total = hvd.allreduce(torch.ones(1), op=hvd.Sum)
            send({"event": "step", "size": hvd.size(), "total": float(total.item())})
            state.step += 1
            time.sleep(0.05)
            state.commit()
        return int(state.step), hvd.size()

    return train(state)


def test_elastic_job_grows_when_a_host_appears() -> None:
    discovery = StaticHostDiscovery("host-1:1")
    lock = threading.Lock()
    messages: list[dict[str, Any]] = []

    def on_message(message: dict[str, Any]) -> None:
        with lock:
            messages.append(message)
            if message["event"] == "step" and message["size"] == 1:
                discovery.set_hosts("host-1:1,host-2:1")

    settings = RayExecutor.create_settings(timeout_s=60, discovery=discovery)
    executor = RayExecutor(
        settings, min_workers=1, max_workers=2, override_discovery=False, cpus_per_worker=0.5, backend="horovod"
    )
    with executor:
        executor.start()
        results = executor.run(horovod_training, args=[120], callbacks=[on_message])
    assert [steps for steps, _ in results] == [120] * len(results)
    sizes = [m["size"] for m in messages if m["event"] == "step"]
    assert sizes[0] == 1
    assert 2 in sizes, "the worker on the new host never joined"
    assert all(m["total"] == m["size"] for m in messages if m["event"] == "step")
