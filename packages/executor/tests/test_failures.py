"""Failures surface fast, name the rank, and never leave the executor hung or holding resources."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from elastrain.executor import PlacementError, RayExecutor, WorkerDiedError, WorkerError, context

pytestmark = pytest.mark.usefixtures("ray_4_cpus")


def executor(num_workers: int, **kwargs: object) -> RayExecutor:
    settings = RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=2)
    return RayExecutor(settings, num_workers=num_workers, cpus_per_worker=0.5, **kwargs)  # type: ignore[arg-type]


def raise_on_rank_one() -> int:
    if context().rank == 1:
        raise ValueError("bad batch on rank one")
    return context().rank


def test_worker_error_names_the_rank_and_carries_the_traceback() -> None:
    with executor(2) as ex:
        ex.start()
        with pytest.raises(WorkerError, match=r"Rank 1 worker raised an error") as caught:
            ex.run(raise_on_rank_one)
        assert caught.value.rank == 1
        assert "ValueError: bad batch on rank one" in caught.value.remote_traceback
        assert "raise_on_rank_one" in caught.value.remote_traceback
        assert isinstance(caught.value.cause, ValueError)
        assert caught.value.__cause__ is None  # Python would print the cause's text again above the traceback
        # The other worker finished, so the group is intact and the executor stays usable.
        assert ex.run(lambda: context().rank) == [0, 1]


def call_a_dead_actor() -> int:
    import ray

    @ray.remote(num_cpus=0)
    class Helper:
        def ping(self) -> int:
            return 1

    helper = Helper.remote()  # type: ignore[attr-defined]
    ray.get(helper.ping.remote(), timeout=30)
    ray.kill(helper)
    # ray.kill is asynchronous: a call right after it may still be answered, so call until one fails
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ray.get(helper.ping.remote(), timeout=30)
        time.sleep(0.05)
    return 0


def test_a_worker_raising_because_another_actor_died_is_an_error_not_a_death() -> None:
    """The worker lived: the caller gets its traceback, and the executor stays usable."""
    with executor(1) as ex:
        ex.start()
        with pytest.raises(WorkerError, match=r"Rank 0 worker raised an error") as caught:
            ex.run(call_a_dead_actor)
        assert "call_a_dead_actor" in caught.value.remote_traceback
        assert ex.run(lambda: context().rank) == [0]


def stuck_in_allreduce_unless_rank_one() -> None:
    import torch
    import torch.distributed as dist

    from elastrain.executor import init_process_group

    init_process_group()
    if context().rank == 1:
        raise RuntimeError("rank one gives up before the collective")
    dist.all_reduce(torch.ones(1))  # blocks: rank one never joins


def test_peers_blocked_on_a_failed_worker_do_not_hang_the_executor() -> None:
    with executor(2) as ex:
        ex.start()
        start = time.monotonic()
        with pytest.raises(WorkerError, match="Rank 1 worker raised") as caught:
            ex.run(stuck_in_allreduce_unless_rank_one)
        assert time.monotonic() - start < 30
        assert any("call start() again" in note for note in caught.value.__notes__)
        assert not ex.started
        ex.start()  # a fresh group of workers
        assert ex.run(lambda: context().rank) == [0, 1]


def test_killed_worker_fails_the_call_within_seconds_naming_rank_and_node() -> None:
    import ray

    def exit_on_rank_zero() -> None:
        if context().rank == 0:
            os._exit(1)
        time.sleep(60)

    with executor(2) as ex:
        ex.start()
        node_id = ray.get_runtime_context().get_node_id()
        start = time.monotonic()
        with pytest.raises(WorkerDiedError, match=rf"Rank 0 worker on node {node_id} died") as caught:
            ex.run(exit_on_rank_zero)
        assert time.monotonic() - start < 10
        assert caught.value.rank == 0
        assert not ex.started  # a group with a dead worker is shut down


def test_worker_killed_from_outside() -> None:
    import ray

    with executor(2) as ex:
        ex.start()
        refs = ex.run_remote(time.sleep, args=[60])
        victim = ex._calls.actors[1]  # type: ignore[union-attr]
        ray.kill(victim)
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(refs[1], timeout=20)


def impossible(**kwargs: object) -> RayExecutor:
    settings = RayExecutor.create_settings(timeout_s=60, placement_group_timeout_s=60)
    return RayExecutor(settings, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"num_workers": 64},
            r"num_workers=64 workers with 1 CPU each \(64 CPU in all\) .* it has 4 CPU in total \(its 1 node\), "
            r"room for 4 such workers\. No autoscaler is configured .* Ask for num_workers=4 or fewer",
        ),
        ({"num_workers": 1, "cpus_per_worker": 5}, r"room for 0 such workers.* Ask for fewer resources per worker"),
        ({"num_workers": 2, "use_gpu": True}, r"1 CPU, 1 GPU each .* it has 4 CPU, 0 GPU in total .* use_gpu=False"),
        ({"num_hosts": 2, "num_workers_per_host": 1}, r"num_hosts=2 hosts.* only 1 of its nodes has .* num_hosts=1"),
        ({"num_hosts": 1, "num_workers_per_host": 8}, r"8 CPU for its workers.* fewer workers per host"),
    ],
)
def test_a_request_the_cluster_can_never_hold_fails_at_once(kwargs: dict[str, object], message: str) -> None:
    """Like Horovod's, the error is a TimeoutError; unlike Horovod's, it comes before placement_group_timeout_s."""
    ex = impossible(**kwargs)
    start = time.monotonic()
    with pytest.raises(PlacementError, match=message) as caught:
        ex.start()
    assert time.monotonic() - start < 5
    assert isinstance(caught.value, TimeoutError)
    assert not ex.started


def test_placement_that_may_be_granted_later_waits_for_the_timeout_then_is_a_timeout_error() -> None:
    """Fits the cluster but not what is free now: waits placement_group_timeout_s, then frees its request."""
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

    held = placement_group([{"CPU": 3.5}])
    ray.get(held.ready(), timeout=30)
    try:
        ex = executor(2)  # 2 × 0.5 CPU; 0.5 free
        start = time.monotonic()
        with pytest.raises(TimeoutError, match=r"could not place 2 bundles .* within placement_group_timeout_s=2"):
            ex.start()
        assert 2 <= time.monotonic() - start < 15
        assert not ex.started
        pending = [g for g in placement_group_table().values() if g["state"] not in ("REMOVED", "CREATED")]
        assert pending == []
    finally:
        remove_placement_group(held)


@pytest.mark.parametrize("sign", ["env", "cluster_launcher"])
def test_a_cluster_that_may_grow_is_waited_for(sign: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With an autoscaler (or ELASTRAIN_CLUSTER_CAN_GROW=1), a request larger than the cluster waits."""
    if sign == "env":
        monkeypatch.setenv("ELASTRAIN_CLUSTER_CAN_GROW", "1")
    else:  # the head node of a cluster started by Ray's cluster launcher
        (tmp_path / "ray_bootstrap_config.yaml").write_text("cluster_name: test\n")
        monkeypatch.setenv("HOME", str(tmp_path))
    ex = executor(64)
    start = time.monotonic()
    with pytest.raises(PlacementError, match="within placement_group_timeout_s=2"):
        ex.start()
    assert time.monotonic() - start >= 2


def test_cluster_can_grow_must_be_0_or_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELASTRAIN_CLUSTER_CAN_GROW", "yes")
    with pytest.raises(ValueError, match=r"ELASTRAIN_CLUSTER_CAN_GROW must be 1 .* it is 'yes'"):
        executor(2).start()
    monkeypatch.setenv("ELASTRAIN_CLUSTER_CAN_GROW", "0")
    with pytest.raises(PlacementError, match="can never hold"):
        executor(64).start()


def test_failing_executable_constructor() -> None:
    class Broken:
        def __init__(self) -> None:
            raise OSError("dataset missing")

    ex = executor(2)
    with pytest.raises(WorkerError, match="dataset missing"):
        ex.start(executable_cls=Broken)
    assert not ex.started
