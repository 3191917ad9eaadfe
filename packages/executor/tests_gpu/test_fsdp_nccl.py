"""An FSDP2 model on nccl, one CUDA device per worker: a worker is killed, the survivor reshards the committed
state from memory onto the world it is left with and goes on without restarting, a replacement joins, and the
weights end where a failure-free run ends.

The chunks' CPU copies and the buddy ring are the same as on CPU; the pieces of a reset move over the world's
nccl group, through the device.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elastrain.executor import RayExecutor, elastic, send
from elastrain_testutils.ray_testing import local_ray

FAIL_AT = 8
STEPS = 30
BATCH, FEATURES, LR = 16, 32, 1e-3


@pytest.fixture(scope="module", autouse=True)
def ray_with_gpus() -> Iterator[None]:
    import torch

    with local_ray(num_cpus=4, num_gpus=torch.cuda.device_count()):
        yield


def make_model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))


def batch_for(step: int) -> tuple[Any, Any]:
    import torch

    generator = torch.Generator().manual_seed(500 + step)
    inputs = torch.randn(BATCH, FEATURES, generator=generator)
    return inputs, inputs[:, :4].cumsum(1)


def train(marker: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    torch.backends.cuda.matmul.allow_tf32 = False  # the reference runs in full float32 on the CPU
    device = torch.device("cuda", 0)

    def build(mesh: Any) -> Any:
        model = make_model().to(device)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.AdamW(model.parameters(), lr=LR)

    state = elastic.ShardedTorchState(build, step=0)

    @elastic.run
    def loop(state: elastic.ShardedTorchState) -> dict[str, Any]:
        model, optimizer = state.model, state.optimizer
        rank, size = dist.get_rank(), dist.get_world_size()
        send({"event": "load", "pid": os.getpid(), "rank": rank, "size": size, **state.last_load})
        while state.step < STEPS:
            if rank == 1 and state.step == FAIL_AT and not os.path.exists(marker):
                Path(marker).touch()
                os._exit(1)
            inputs, labels = (t.to(device) for t in batch_for(state.step))
            share = BATCH // size
            mine = slice(rank * share, (rank + 1) * share)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(inputs[mine]), labels[mine]).backward()
            optimizer.step()
            state.step += 1
            send({"event": "step", "backend": dist.get_backend(), "size": size})
            state.commit()
        with torch.no_grad():
            weights = {name: t.full_tensor().cpu() for name, t in model.state_dict().items()}
        return {"weights": weights, "pid": os.getpid()}

    return dict(loop(state))


def reference() -> dict[str, Any]:
    import torch

    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    for step in range(STEPS):
        inputs, labels = batch_for(step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs), labels).backward()
        optimizer.step()
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def test_an_fsdp_model_on_nccl_recovers_a_killed_worker_from_memory(tmp_path: Path) -> None:
    import torch

    marker = tmp_path / "failed"
    messages: list[dict[str, Any]] = []
    settings = RayExecutor.create_settings(timeout_s=120, collective_timeout_s=120)
    with RayExecutor(settings, min_workers=1, max_workers=2, use_gpu=True, cpus_per_worker=1) as executor:
        executor.start()
        results = executor.run(train, args=[str(marker)], callbacks=[messages.append])
    assert marker.exists(), "the planned kill did not happen"
    assert {m["backend"] for m in messages if m["event"] == "step"} == {"nccl"}
    loads = [m for m in messages if m["event"] == "load"]
    first_pids = {m["pid"] for m in loads if m["path"] == "fresh"}
    after_kill = [m for m in loads if m["path"] == "memory" and m["pid"] in first_pids]
    assert after_kill, f"no survivor loaded the state from memory: {loads}"
    assert after_kill[0]["lost_commits"] == 0
    assert first_pids & {r["pid"] for r in results}, "the survivor was restarted"
    expected = reference()
    for result in results:
        for name, tensor in expected.items():
            torch.testing.assert_close(result["weights"][name], tensor, rtol=1e-4, atol=1e-5)
