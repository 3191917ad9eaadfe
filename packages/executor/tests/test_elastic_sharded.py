"""An FSDP2 job under RayExecutor, written as a user writes it: a worker crashes mid-run, the survivors go on
from their in-memory copies without restarting, a replacement joins, and the weights end where a run without
failures ends.

All hosts are fake ``node:host-N`` resources on one Ray node (conftest.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from elastic_training_kit import BATCH, Recorder, batch_for, crash_if_marked, elastic_executor, last_step, make_model

from elastrain.discovery import StaticHostDiscovery
from elastrain.executor import elastic, send

pytestmark = pytest.mark.usefixtures("ray_with_scripted_hosts")

LR = 0.01


def train_fsdp(steps: int | str, crash_dir: str | None, shard_size: int | None = None) -> dict[str, Any]:
    import os

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    def build(mesh: Any) -> Any:
        model = make_model()
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.AdamW(model.parameters(), lr=LR)

    # HSDP: replica groups of ``shard_size`` ranks, each holding one whole copy of the model in shards.
    mesh_shape = None if shard_size is None else (lambda size: (size // shard_size, shard_size))
    state = elastic.ShardedTorchState(build, mesh_shape=mesh_shape, step=0)

    @elastic.run
    def loop(state: elastic.ShardedTorchState) -> dict[str, Any]:
        model, optimizer = state.model, state.optimizer
        rank, size = dist.get_rank(), dist.get_world_size()
        send({"event": "load", "rank": rank, "size": size, "pid": os.getpid(), **state.last_load})
        while state.step < last_step(steps):
            crash_if_marked(crash_dir, rank, state.step)
            inputs, targets = batch_for(state.step)
            shard = slice(rank * BATCH // size, (rank + 1) * BATCH // size)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(inputs[shard]), targets[shard]).backward()
            optimizer.step()
            state.step += 1
            send({"event": "step", "step": state.step, "size": size, "rank": rank})
            state.commit()
        with torch.no_grad():
            return {name: tensor.full_tensor().clone() for name, tensor in model.state_dict().items()}

    result: dict[str, Any] = loop(state)
    return result


def reference_weights(steps: int) -> dict[str, Any]:
    """The same training in one process: FSDP averages equal shards' gradients, as one full batch does."""
    import torch

    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    for step in range(steps):
        inputs, targets = batch_for(step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def assert_every_worker_ends_at_the_reference(results: list[dict[str, Any]], workers: int, stop_file: Path) -> None:
    """Every worker's final weights are those of the failure-free run of as many steps as the job ran."""
    import torch

    expected = reference_weights(int(stop_file.read_text()))
    assert len(results) == workers
    for weights in results:
        for name, value in expected.items():
            torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-6)


def test_fsdp_job_survives_a_crash_from_memory_and_takes_a_replacement(crash_dir: Path) -> None:

    (crash_dir / "crash-2-5").touch()
    discovery = StaticHostDiscovery("host-1:1,host-2:1,host-3:1")
    stop_file = crash_dir / "stop"
    recorder = Recorder(
        discovery, [(lambda m: m["event"] == "step" and m["size"] == 2, None)], stop_file=stop_file, final_size=3
    )
    with elastic_executor(discovery, min_workers=2, max_workers=3) as executor:
        executor.start()
        results = executor.run(train_fsdp, args=[str(stop_file), str(crash_dir)], callbacks=[recorder])
    assert not (crash_dir / "crash-2-5").exists(), "the planned crash did not happen"
    loads = recorder.events("load")
    first = [m for m in loads if m["path"] == "fresh"]
    assert sorted(m["rank"] for m in first) == [0, 1, 2]
    survivors = {m["pid"] for m in first if m["rank"] in (0, 1)}
    after_crash = [m for m in loads if m["size"] == 2]
    assert after_crash, "the survivors never formed a world of two"
    assert all(m["path"] == "memory" and m["lost_commits"] == 0 for m in after_crash), after_crash
    assert {m["pid"] for m in after_crash} == survivors, "the survivors were restarted"
    regrown = [m for m in loads if m["size"] == 3 and m["path"] == "memory"]
    assert any(m["pid"] not in survivors for m in regrown), "the replacement never joined"
    assert_every_worker_ends_at_the_reference(results, 3, stop_file)


def test_hsdp_replica_groups_a_lost_group_waits_and_heals_from_a_live_replica(crash_dir: Path) -> None:
    """Two replica groups of two (size_multiple=2). Rank 1 dies: the untouched group goes on alone with the
    chunks it holds (nothing moves), rank 0 waits alive outside it, and once a replacement is up the new group
    takes every chunk from the live replica."""

    (crash_dir / "crash-1-5").touch()
    discovery = StaticHostDiscovery("host-1:1,host-2:1,host-3:1,host-4:1")
    stop_file = crash_dir / "stop"
    recorder = Recorder(
        discovery, [(lambda m: m["event"] == "step" and m["size"] == 2, None)], stop_file=stop_file, final_size=4
    )
    with elastic_executor(discovery, min_workers=2, max_workers=4, size_multiple=2) as executor:
        executor.start()
        results = executor.run(train_fsdp, args=[str(stop_file), str(crash_dir), 2], callbacks=[recorder])
    assert not (crash_dir / "crash-1-5").exists(), "the planned crash did not happen"
    loads = recorder.events("load")
    first = {m["rank"]: m["pid"] for m in loads if m["path"] == "fresh"}
    assert sorted(first) == [0, 1, 2, 3]
    alone = [m for m in loads if m["size"] == 2]
    assert alone, "the untouched replica group never went on alone"
    assert {m["pid"] for m in alone} == {first[2], first[3]}, "the group that went on is not the untouched one"
    assert all(m["path"] == "memory" and m["lost_commits"] == 0 for m in alone), alone
    assert all(m["received_bytes"] == 0 for m in alone), "the untouched group moved chunks it already held"
    by_generation: dict[int, list[dict[str, Any]]] = {}
    for message in loads:
        if message["size"] == 4 and message["generation"] > alone[0]["generation"]:
            by_generation.setdefault(message["generation"], []).append(message)
    whole = [group for _, group in sorted(by_generation.items()) if len(group) == 4]
    assert whole, "the lost replica group never came back"
    heal = whole[0]  # the first world of four after the loss: the heal
    newcomers = [m for m in heal if m["pid"] not in (first[2], first[3])]
    assert first[0] in {m["pid"] for m in newcomers}, "rank 0 was restarted instead of waiting"
    assert all(m["received_bytes"] > 0 for m in newcomers), "the healing group did not receive its chunks"
    assert all(m["received_bytes"] == 0 for m in heal if m not in newcomers), "a live replica received chunks"
    assert_every_worker_ends_at_the_reference(results, 4, stop_file)
