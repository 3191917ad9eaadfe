"""A worker killed, and a worker frozen, in an elastic job on nccl: the survivor goes on, on its GPU.

Each worker holds one CUDA device (Ray sets ``CUDA_VISIBLE_DEVICES``); the group uses nccl. One worker fails
once at step 10 (a marker file records it), the survivor's next collective fails and it continues alone, and
a replacement joins later. The survivor must never be torn down (``TORCH_NCCL_ASYNC_ERROR_HANDLING``), and
destroying the broken communicator must not hang.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elastrain.executor import RayExecutor, elastic, send
from elastrain_testutils.ray_testing import local_ray

FAIL_AT = 10
STEPS = 60


@pytest.fixture(scope="module", autouse=True)
def ray_with_gpus() -> Iterator[None]:
    import torch

    with local_ray(num_cpus=4, num_gpus=torch.cuda.device_count()):
        yield


def train(marker: str, how: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", 0)
    state = elastic.ObjectState(step=0)

    @elastic.run
    def loop(state: elastic.ObjectState) -> dict[str, Any]:
        while state.step < STEPS:
            rank, size = dist.get_rank(), dist.get_world_size()
            if rank == 1 and state.step == FAIL_AT and not os.path.exists(marker):
                Path(marker).write_text(str(time.time()))
                if how == "kill":
                    os._exit(1)
                # To this thread: a process-wide SIGSTOP reaches the main thread first, and the job's thread (Ray
                # runs it on a pool thread) could enter one more collective meanwhile.
                signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
            value = torch.ones(1, device=device)
            dist.all_reduce(value)
            assert value.item() == size
            state.step += 1
            send({"t": time.time(), "size": size, "pid": os.getpid(), "backend": dist.get_backend()})
            time.sleep(0.05)
            state.commit()
        return {"steps": state.step, "pid": os.getpid()}

    return dict(loop(state))


@pytest.mark.parametrize("how", ["kill", "freeze"])
def test_the_survivor_goes_on_after_a_peer_fails(how: str, tmp_path: Path) -> None:
    marker = tmp_path / "failed"
    messages: list[dict[str, Any]] = []
    settings = RayExecutor.create_settings(timeout_s=120, liveness_timeout_s=5.0, collective_timeout_s=300)
    with RayExecutor(settings, min_workers=1, max_workers=2, use_gpu=True, cpus_per_worker=1) as executor:
        executor.start()
        results = executor.run(train, args=[str(marker), how], callbacks=[messages.append])
    failed_at = float(marker.read_text())
    assert {r["steps"] for r in results} == {STEPS}
    assert {m["backend"] for m in messages} == {"nccl"}
    before = {m["pid"] for m in messages if m["t"] < failed_at}
    after = [m for m in messages if m["t"] > failed_at]
    survivors = {m["pid"] for m in after} & before
    assert survivors, "no worker from before the failure trained after it"
    assert survivors <= {r["pid"] for r in results}  # never torn down: they finished the job
    print(f"{how}: survivor's next step {after[0]['t'] - failed_at:.2f} s after the failure")
