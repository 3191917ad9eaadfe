"""Static jobs on a real local Ray: collectives, DDP, executables, callbacks, the worker context."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from elastrain.executor import ExecutorNotStartedError, RayExecutor, context, init_process_group, send

pytestmark = pytest.mark.usefixtures("ray_4_cpus")


def executor(num_workers: int, **kwargs: Any) -> RayExecutor:
    return RayExecutor(
        RayExecutor.create_settings(timeout_s=60), num_workers=num_workers, cpus_per_worker=0.5, **kwargs
    )


def allreduce_rank_plus_one() -> float:
    import torch
    import torch.distributed as dist

    init_process_group()
    value = torch.tensor([float(context().rank + 1)])
    dist.all_reduce(value)
    return float(value.item())


@pytest.mark.parametrize("num_workers", [2, 4])
def test_gloo_allreduce_sums_over_workers(num_workers: int) -> None:
    with executor(num_workers) as ex:
        ex.start()
        assert ex.run(allreduce_rank_plus_one) == [num_workers * (num_workers + 1) / 2] * num_workers


def train_ddp(steps: int) -> list[list[float]]:
    import torch
    from torch.nn.parallel import DistributedDataParallel

    init_process_group()
    torch.manual_seed(0)  # same initial weights everywhere; DDP would broadcast them anyway
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(100 + context().rank)  # each rank sees different data
    for _ in range(steps):
        inputs = torch.randn(8, 4, generator=generator)
        loss = model(inputs).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return [p.detach().flatten().tolist() for p in model.parameters()]


def test_ddp_keeps_parameters_identical_across_ranks() -> None:
    with executor(2) as ex:
        ex.start()
        first, second = ex.run(train_ddp, args=[3])
        assert first == second
        torch = pytest.importorskip("torch")
        torch.manual_seed(0)
        assert first != [p.detach().flatten().tolist() for p in torch.nn.Linear(4, 1).parameters()]


class Counter:
    def __init__(self, start: int) -> None:
        self.count = start

    def bump(self) -> int:
        self.count += 1
        return self.count


def test_executable_state_persists_across_execute_calls() -> None:
    with executor(2) as ex:
        ex.start(executable_cls=Counter, executable_args=[10])
        assert ex.execute(lambda counter: counter.bump()) == [11, 11]
        assert ex.execute(lambda counter: counter.bump()) == [12, 12]
        assert ex.execute_single(lambda counter: counter.count) == 12


def test_run_remote_returns_object_refs_by_rank() -> None:
    import ray

    with executor(2) as ex:
        ex.start()
        refs = ex.run_remote(lambda x: (context().rank, x), args=[7])
        assert ray.get(refs, timeout=30) == [(0, 7), (1, 7)]


def test_run_passes_args_and_kwargs() -> None:
    with executor(2) as ex:
        ex.start()
        assert ex.run(lambda a, b=0: a + b + context().rank, args=[1], kwargs={"b": 10}) == [11, 12]


def test_worker_context_and_torchrun_environment() -> None:
    def describe() -> dict[str, Any]:
        ctx = context()
        names = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE"]
        return {
            "ctx": ctx,
            "env": {name: os.environ[name] for name in names},
            "master": (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]),
            "extra": os.environ["MY_SETTING"],
            "pid": os.getpid(),
        }

    import ray

    with executor(2) as ex:
        ex.start(extra_env_vars={"MY_SETTING": "on"})
        first, second = ex.run(describe)
    node_id = ray.get_runtime_context().get_node_id()
    for rank, seen in enumerate([first, second]):
        ctx = seen["ctx"]
        assert (ctx.rank, ctx.size, ctx.local_rank, ctx.local_size) == (rank, 2, rank, 2)
        assert (ctx.cross_rank, ctx.cross_size, ctx.node_rank, ctx.num_nodes) == (0, 1, 0, 1)
        assert ctx.node_id == node_id
        assert ctx.hostname
        assert ctx.pid == seen["pid"]
        assert seen["env"] == {
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "0",
            "GROUP_WORLD_SIZE": "1",
        }
        assert seen["extra"] == "on"
    assert first["master"] == second["master"]
    assert first["pid"] != second["pid"]


def test_callbacks_are_delivered_while_the_job_runs(tmp_path: Path) -> None:
    marker = tmp_path / "seen"

    def train() -> bool:
        send({"rank": context().rank, "step": 1})
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # finishes only once the driver has seen the message
            if marker.exists():
                return True
            time.sleep(0.01)
        return False

    received: list[dict[str, Any]] = []

    def on_message(message: dict[str, Any]) -> None:
        received.append(message)
        marker.touch()

    with executor(2) as ex:
        ex.start()
        assert ex.run(train, callbacks=[on_message]) == [True, True]
    assert sorted(m["rank"] for m in received) == [0, 1]


def test_every_message_arrives_in_order_before_run_returns() -> None:
    def chatty() -> None:
        for step in range(50):
            send({"rank": context().rank, "step": step})

    received: list[dict[str, Any]] = []
    with executor(2) as ex:
        ex.start()
        ex.run(chatty, callbacks=[received.append])
        for rank in (0, 1):
            assert [m["step"] for m in received if m["rank"] == rank] == list(range(50))
        received.clear()
        ex.run(chatty)  # without callbacks messages are dropped, not kept for later
        ex.run(lambda: None, callbacks=[received.append])
        assert received == []


def test_a_callback_that_raises_fails_the_call() -> None:
    def boom(message: dict[str, Any]) -> None:
        raise KeyError("callback bug")

    with executor(1) as ex:
        ex.start()
        with pytest.raises(KeyError, match="callback bug"):
            ex.run(lambda: send({"x": 1}), callbacks=[boom])
        assert ex.run(lambda: 5) == [5]


def test_bad_callbacks_and_env_vars() -> None:
    with executor(1) as ex:
        with pytest.raises(ValueError, match="extra_env_vars must map strings to strings"):
            ex.start(extra_env_vars={"N": 1})  # type: ignore[dict-item]
        ex.start()
        with pytest.raises(TypeError, match="callbacks must be a list of functions"):
            ex.run(lambda: 1, callbacks=print)  # type: ignore[arg-type]


def test_calls_before_start_and_after_shutdown() -> None:
    ex = executor(1)
    with pytest.raises(ExecutorNotStartedError, match=r"call start\(\) first"):
        ex.run(lambda: 1)
    ex.start()
    with pytest.raises(RuntimeError, match="already started"):
        ex.start()
    ex.shutdown()
    ex.shutdown()
    with pytest.raises(ExecutorNotStartedError):
        ex.execute(lambda _: 1)


def test_context_outside_a_worker() -> None:
    with pytest.raises(RuntimeError, match="only available inside a function that a RayExecutor runs"):
        context()
    send({"dropped": True})  # outside a worker: dropped, no error


def test_placement_group_is_freed_on_shutdown() -> None:
    from ray.util.placement_group import placement_group_table

    ex = executor(2)
    ex.start()
    group_id = ex._placement_group.id.hex()
    ex.shutdown()
    assert placement_group_table()[group_id]["state"] == "REMOVED"


def test_runs_inside_the_callers_placement_group() -> None:
    """A job started from a task in a placement group (a Ray Tune trial) keeps its workers in that group."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = placement_group([{"CPU": 0.5}] * 3)
    ray.get(group.ready(), timeout=30)

    @ray.remote(num_cpus=0.5)
    def trial() -> list[str]:
        with executor(2) as ex:
            ex.start()
            return ex.run(lambda: ray.get_runtime_context().get_placement_group_id())  # type: ignore[no-any-return]

    try:
        strategy = PlacementGroupSchedulingStrategy(group, placement_group_capture_child_tasks=True)
        assert ray.get(trial.options(scheduling_strategy=strategy).remote(), timeout=120) == [group.id.hex()] * 2
    finally:
        remove_placement_group(group)
