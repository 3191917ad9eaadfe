"""Failures surface fast, name the rank, and never leave the executor hung or holding resources."""

from __future__ import annotations

import os
import time

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
        assert isinstance(caught.value.__cause__, ValueError)
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
    return int(ray.get(helper.ping.remote(), timeout=30))


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


def test_unsatisfiable_placement_fails_after_the_timeout() -> None:
    ex = executor(20)  # 20 × 0.5 CPU on a 4-CPU node
    start = time.monotonic()
    with pytest.raises(PlacementError, match=r"could not place 20 bundles .* within placement_group_timeout_s=2"):
        ex.start()
    assert time.monotonic() - start < 15
    assert not ex.started


def test_strict_spread_on_one_node_fails_clearly() -> None:
    settings = RayExecutor.create_settings(placement_group_timeout_s=1)
    ex = RayExecutor(settings, num_hosts=2, num_workers_per_host=1, cpus_per_worker=0.5)
    with pytest.raises(PlacementError, match="STRICT_SPREAD needs one node per host"):
        ex.start()


def test_failing_executable_constructor() -> None:
    class Broken:
        def __init__(self) -> None:
            raise OSError("dataset missing")

    ex = executor(2)
    with pytest.raises(WorkerError, match="dataset missing"):
        ex.start(executable_cls=Broken)
    assert not ex.started
