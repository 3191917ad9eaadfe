"""Executor jobs as Tune trials: workers in the trial's placement group, send() → results, persisted state that a
restarted trial resumes from, and the errors a user meets first."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elastrain.executor import elastic as executor_elastic
from elastrain.tune import StoreInUseError, executor_trainable, trial_persistence
from elastrain_testutils.ray_testing import local_cluster
from elastrain_testutils.waiting import wait_until

STEPS = 20


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    # Trial drivers on the head; two nodes for workers.
    with local_cluster({"num_cpus": 1}, {"num_cpus": 1}, {"num_cpus": 1}) as cluster:
        yield cluster


def count_to(config: dict[str, Any]) -> dict[str, Any]:
    """An elastic job whose outcome does not depend on its world size: the sum of 1..steps."""
    import ray
    import torch
    import torch.distributed as dist

    from elastrain.executor import elastic, send

    state = elastic.ObjectState(step=0, total=0)
    state.persist_with(trial_persistence())
    crash_file = config.get("crash_file")

    @elastic.run
    def loop(state: elastic.ObjectState) -> dict[str, Any]:
        first_step = int(state.step)
        while state.step < config["steps"]:
            ones = torch.ones(1)
            dist.all_reduce(ones)  # a real collective over the trial's workers
            state.total += state.step + 1
            state.step += 1
            if crash_file and state.step == 12 and dist.get_rank() == 0 and os.path.exists(crash_file):
                os.remove(crash_file)
                raise RuntimeError("planned failure")
            time.sleep(config.get("step_s", 0))
            send(
                {
                    "step": int(state.step),
                    "loss": config.get("scale", 1.0) / state.step,
                    "size": int(ones.item()),
                    "group": ray.get_runtime_context().get_placement_group_id(),
                }
            )
            state.commit()
        trial_persistence().flush(timeout=60)
        return {"total": int(state.total), "first_step": first_step}

    result: dict[str, Any] = loop(state)
    return result


def _fit(
    trainable: Any, tmp_path: Path, *, param_space: dict[str, Any], max_failures: int = 0, name: str = "exp"
) -> Any:
    from ray import tune

    tuner = tune.Tuner(
        trainable,
        param_space=param_space,
        run_config=tune.RunConfig(
            storage_path=str(tmp_path / "tune"),
            name=name,
            failure_config=tune.FailureConfig(max_failures=max_failures),
            verbose=0,
        ),
    )
    return tuner.fit()


def test_an_elastic_job_runs_as_a_trial_in_its_placement_group(cluster: Any, tmp_path: Path) -> None:
    import ray

    from elastrain.durable import CheckpointStore

    trainable = executor_trainable(
        count_to,
        storage=str(tmp_path / "store"),
        min_workers=1,
        max_workers=2,
        persist_every=5,
        num_to_keep=2,
        strategy="SPREAD",
    )
    grid = _fit(trainable, tmp_path, param_space={"steps": STEPS})
    result = grid[0]
    assert result.error is None, result.error
    metrics = result.metrics
    assert metrics["step"] == STEPS
    assert metrics["total"] == STEPS * (STEPS + 1) // 2
    assert metrics["size"] == 2
    assert metrics["done"]
    assert metrics["group"], "the workers ran outside any placement group"
    groups = ray.util.placement_group_table()  # removed ones too: the trial has ended
    assert groups[metrics["group"]]["bundles"] == {0: {"CPU": 1.0}, 1: {"CPU": 1.0}}  # the trial's worker bundles
    history = result.metrics_dataframe
    steps = list(history["step"])
    assert steps[:-1] == sorted(set(steps[:-1])), "a step was reported twice"  # the last, with done, repeats it
    assert steps[-1] == STEPS
    # The job's state went to the trial's own store: exactly num_to_keep, the latest at the last commit. A copy
    # handed over while an upload runs is dropped for a newer one, so the older kept one is any earlier multiple.
    trial_id = metrics["trial_id"]
    store = CheckpointStore(str(tmp_path / "store" / "exp" / trial_id))
    kept = [c.step for c in store.list()]
    assert len(kept) == 2, kept
    assert kept[0] in (5, 10, 15), kept
    assert kept[1] == STEPS, kept
    store.close()


def test_a_trial_tune_restarts_resumes_from_its_latest_persisted_state(cluster: Any, tmp_path: Path) -> None:
    crash_file = tmp_path / "crash"
    crash_file.touch()
    trainable = executor_trainable(
        count_to, storage=str(tmp_path / "store"), min_workers=2, max_workers=2, persist_every=5
    )
    grid = _fit(trainable, tmp_path, param_space={"steps": STEPS, "crash_file": str(crash_file)}, max_failures=1)
    result = grid[0]
    assert result.error is None, result.error
    assert not crash_file.exists()  # the planned failure happened
    assert result.metrics["first_step"] == 10  # resumed from the commit persisted before it, not from 0
    assert result.metrics["total"] == STEPS * (STEPS + 1) // 2


def fsdp_sum(config: dict[str, Any]) -> dict[str, Any]:
    """An FSDP2 model trained on the same batches at any world size: its weights end as the failure-free run's."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from elastrain.executor import elastic, send

    def build(mesh: Any) -> Any:
        model = make_model()
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.SGD(model.parameters(), lr=0.05)

    state = elastic.ShardedTorchState(build, step=0)
    state.persist_with(trial_persistence())
    crash_file = config.get("crash_file")

    @elastic.run
    def loop(state: elastic.ShardedTorchState) -> dict[str, Any]:
        first_step, model, optimizer = int(state.step), state.model, state.optimizer
        rank, size = dist.get_rank(), dist.get_world_size()
        while state.step < config["steps"]:
            inputs, labels = batch_for(state.step)
            share = len(inputs) // size
            mine = slice(rank * share, (rank + 1) * share)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(inputs[mine]), labels[mine])
            loss.backward()
            optimizer.step()
            state.step += 1
            if crash_file and state.step == 12 and rank == 0 and os.path.exists(crash_file):
                os.remove(crash_file)
                raise RuntimeError("planned failure")
            send({"step": int(state.step), "loss": float(loss)})
            state.commit()
        total = sum(float(t.full_tensor().abs().sum()) for t in model.state_dict().values())
        return {"first_step": first_step, "path": state.last_load["path"], "weight_sum": total}

    result: dict[str, Any] = loop(state)
    return result


def make_model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def batch_for(step: int) -> tuple[Any, Any]:
    import torch

    generator = torch.Generator().manual_seed(100 + step)
    inputs = torch.randn(8, 4, generator=generator)
    return inputs, torch.stack([inputs.sum(1), inputs[:, 0]], dim=1)


@pytest.mark.skipif(
    not hasattr(executor_elastic, "ShardedTorchState"),
    reason="needs elastrain-executor > 0.1.0 (elastic.ShardedTorchState); the installed executor predates it",
)
def test_a_sharded_trial_tune_restarts_resumes_from_its_sharded_checkpoint(cluster: Any, tmp_path: Path) -> None:
    import torch

    crash_file = tmp_path / "crash"
    crash_file.touch()
    trainable = executor_trainable(
        fsdp_sum, storage=str(tmp_path / "store"), min_workers=2, max_workers=2, persist_every=5, sharded=True
    )
    grid = _fit(trainable, tmp_path, param_space={"steps": STEPS, "crash_file": str(crash_file)}, max_failures=1)
    result = grid[0]
    assert result.error is None, result.error
    assert not crash_file.exists()  # the planned failure happened
    # Restarted by Tune, every rank loaded its part of commit 10 from the trial's store.
    assert (result.metrics["first_step"], result.metrics["path"]) == (10, "persisted")
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(STEPS):
        inputs, labels = batch_for(step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs), labels).backward()
        optimizer.step()
    expected = sum(float(t.abs().sum()) for t in model.state_dict().values())
    assert result.metrics["weight_sum"] == pytest.approx(expected, rel=1e-5)


def test_an_experiment_name_taken_by_another_experiment_is_refused(cluster: Any, tmp_path: Path) -> None:
    folder = tmp_path / "store" / "exp"
    folder.mkdir(parents=True)
    (folder / "experiment.json").write_text(json.dumps({"experiment_path": "local:/elsewhere/exp"}))
    trainable = executor_trainable(count_to, storage=str(tmp_path / "store"), num_workers=1)
    grid = _fit(trainable, tmp_path, param_space={"steps": 2})
    error = grid[0].error
    assert error is not None
    assert StoreInUseError.__name__ in str(error)
    assert "Give this experiment another name" in str(error)


def test_a_scheduler_stops_a_trial_and_its_workers_go(cluster: Any, tmp_path: Path) -> None:
    import ray
    from ray import tune

    trainable = executor_trainable(count_to, storage=str(tmp_path / "store"), min_workers=1, max_workers=1)
    scheduler = tune.schedulers.ASHAScheduler(time_attr="step", max_t=60, grace_period=5, reduction_factor=2)
    grid = tune.Tuner(
        trainable,
        param_space={"steps": 60, "step_s": 0.05, "scale": tune.grid_search([1.0, 100.0])},
        # One at a time, the better trial first: the worse one then meets its results at every rung.
        tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=scheduler, max_concurrent_trials=1),
        run_config=tune.RunConfig(storage_path=str(tmp_path / "tune"), name="asha", verbose=0),
    ).fit()
    by_scale = {result.config["scale"]: result for result in grid}
    assert all(result.error is None for result in grid)
    assert by_scale[100.0].metrics["step"] < 60  # stopped early by ASHA: its loss is far worse
    # Stopping a trial shut its executor down: every CPU is free again.
    total = ray.cluster_resources()["CPU"]
    wait_until(lambda: ray.available_resources().get("CPU") == total, timeout_s=30, what="the workers to go")


def test_resources_that_can_never_fit_fail_before_tune_runs(cluster: Any, tmp_path: Path) -> None:
    from elastrain.executor import PlacementError

    with pytest.raises(PlacementError, match="This trial asks for 5 bundles"):
        executor_trainable(count_to, storage=str(tmp_path / "store"), num_workers=4, driver={"CPU": 0.5})
