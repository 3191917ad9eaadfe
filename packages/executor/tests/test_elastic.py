"""Elastic jobs with scripted discovery, mirroring Horovod's elastic suite.

All hosts live on one Ray node: each scripted host ``host-N`` is a fake ``node:host-N`` resource, so workers
are pinned to "hosts" that the test adds and removes by changing what discovery reports. Discovery is polled
fast, and every change is triggered by what the workers report, not by sleeps.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from elastic_training_kit import Recorder

from elastrain.discovery import StaticHostDiscovery
from elastrain.executor import RayExecutor, context, elastic, send
from elastrain_testutils.ray_testing import local_ray

HOSTS = {f"node:host-{n}": 100 for n in range(1, 6)}


@pytest.fixture(scope="module", autouse=True)
def ray_with_scripted_hosts() -> Iterator[None]:
    with local_ray(num_cpus=4, resources=HOSTS):
        yield


def train_until(min_steps: int, until_size: int, max_steps: int = 3000) -> int:
    """Allreduce-and-commit steps until at least ``min_steps`` ran in a group of ``until_size`` workers."""
    import torch
    import torch.distributed as dist

    state = elastic.ObjectState(step=0, steps_at_size=0)
    send({"event": "started", "pid": os.getpid()})

    @elastic.run
    def train(state: elastic.ObjectState) -> int:
        while state.step < max_steps:
            size = dist.get_world_size()
            value = torch.ones(1)
            dist.all_reduce(value)
            assert value.item() == size
            state.step += 1
            state.steps_at_size = state.steps_at_size + 1 if size == until_size else 0
            send({"event": "step", "size": size, "step": state.step})
            time.sleep(0.02)
            state.commit()
            if state.steps_at_size >= min_steps:
                break
        return int(state.step)

    steps = train(state)
    send({"event": "finished", "rank": context().rank})
    return steps


def sizes(recorder: Recorder) -> list[int]:
    return [m["size"] for m in recorder.events("step")]


def size_seen(size: int) -> Callable[[dict[str, Any]], bool]:
    return lambda m: m["event"] == "step" and m["size"] == size


def elastic_executor(discovery: StaticHostDiscovery, **kwargs: Any) -> RayExecutor:
    settings = RayExecutor.create_settings(timeout_s=60, discovery=discovery, discovery_interval_s=0.05)
    kwargs.setdefault("elastic_timeout", 60)
    return RayExecutor(settings, override_discovery=False, cpus_per_worker=0.25, **kwargs)


def test_hosts_added_then_removed() -> None:
    discovery = StaticHostDiscovery("host-1:2")
    script = Recorder(discovery, [(size_seen(2), "host-1:2,host-2:1,host-3:1"), (size_seen(4), "host-2:1")])
    with elastic_executor(discovery, min_workers=1) as executor:
        executor.start()
        results = executor.run(train_until, args=[5, 1], callbacks=[script])
    assert len(results) == 1
    assert len(script.events("started")) == 4
    assert len(script.events("finished")) == 1
    assert {2, 4, 1} <= set(sizes(script))
    assert script.plan == []


def test_hosts_removed_then_added() -> None:
    discovery = StaticHostDiscovery("host-1:2,host-2:2,host-3:1")
    script = Recorder(discovery, [(size_seen(5), "host-1:2"), (size_seen(2), "host-1:2,host-4:1,host-5:1")])
    with elastic_executor(discovery, min_workers=1) as executor:
        executor.start()
        results = executor.run(train_until, args=[5, 4], callbacks=[script])
    assert len(results) == 4
    assert len(script.events("finished")) == 4
    assert sizes(script)[-1] == 4


def test_max_workers_is_never_exceeded() -> None:
    discovery = StaticHostDiscovery("host-1:1")
    script = Recorder(discovery, [(size_seen(1), "host-1:2,host-2:2,host-3:2")])
    with elastic_executor(discovery, min_workers=1, max_workers=2) as executor:
        executor.start()
        results = executor.run(train_until, args=[5, 2], callbacks=[script])
    assert len(results) == 2
    assert max(sizes(script)) == 2
    assert len(script.events("started")) == 2


def test_min_workers_waits_for_enough_slots() -> None:
    discovery = StaticHostDiscovery("host-1:2")
    added_at: list[float] = []

    def add_hosts() -> None:
        added_at.append(time.monotonic())
        discovery.set_hosts("host-1:2,host-2:2")

    timer = threading.Timer(1.0, add_hosts)
    step_times: list[tuple[float, int]] = []
    with elastic_executor(discovery, min_workers=4) as executor:
        executor.start()  # returns at once: workers wait for run()
        timer.start()
        results = executor.run(
            train_until,
            args=[3, 4],
            callbacks=[lambda m: m["event"] == "step" and step_times.append((time.monotonic(), m["size"]))],
        )
    assert len(results) == 4
    assert added_at
    assert min(t for t, _ in step_times) > added_at[0]
    assert {size for _, size in step_times} == {4}


def test_too_few_slots_for_too_long_fails_clearly() -> None:
    discovery = StaticHostDiscovery("host-1:2")
    with elastic_executor(discovery, min_workers=3, elastic_timeout=1.0) as executor:
        executor.start()
        start = time.monotonic()
        with pytest.raises(elastic.ElasticJobError, match=r"at least 3 slots; saw 2 slots on 1 hosts"):
            executor.run(train_until, args=[3, 3])
        assert time.monotonic() - start < 10


def test_start_returns_without_waiting_for_workers() -> None:
    discovery = StaticHostDiscovery("host-1:1")
    with elastic_executor(discovery, min_workers=8) as executor:
        start = time.monotonic()
        executor.start()
        assert time.monotonic() - start < 5
        assert executor.started


def test_override_discovery_false_needs_a_discovery() -> None:
    settings = RayExecutor.create_settings()
    executor = RayExecutor(settings, min_workers=1, override_discovery=False)
    with pytest.raises(ValueError, match="override_discovery=False needs a discovery"):
        executor.start()


def test_a_worker_that_raises_fails_the_job() -> None:
    def broken() -> None:
        state = elastic.ObjectState(step=0)

        @elastic.run
        def train(state: elastic.ObjectState) -> None:
            raise ValueError("bad data")

        train(state)

    discovery = StaticHostDiscovery("host-1:2")
    with elastic_executor(discovery, min_workers=2) as executor:
        executor.start()
        with pytest.raises(Exception, match="bad data"):
            executor.run(broken)


def test_reset_limit_stops_the_job() -> None:
    discovery = StaticHostDiscovery("host-1:2")
    script = Recorder(discovery, [(size_seen(2), "host-1:1"), (size_seen(1), "host-1:2")])
    with elastic_executor(discovery, min_workers=1, reset_limit=1) as executor:
        executor.start()
        with pytest.raises(elastic.ElasticJobError, match=r"reset 2, beyond reset_limit=1"):
            executor.run(train_until, args=[10_000, 3], callbacks=[script])


def test_below_min_workers_for_too_long_fails_mid_run() -> None:
    discovery = StaticHostDiscovery("host-1:2")
    script = Recorder(discovery, [(size_seen(2), "host-1:1")])
    with elastic_executor(discovery, min_workers=2, elastic_timeout=3.0) as executor:
        executor.start()
        start = time.monotonic()
        with pytest.raises(elastic.ElasticJobError, match=r"fewer than min_workers=2 workers for more than"):
            executor.run(train_until, args=[10_000, 3], callbacks=[script])
        assert time.monotonic() - start < 60


def test_shutdown_from_another_thread_ends_a_running_job() -> None:
    """``shutdown()`` (e.g. a ``with`` block left on an error) stops the workers of a call still running."""
    discovery = StaticHostDiscovery("host-1:2")
    script = Recorder(discovery, [])
    executor = elastic_executor(discovery, min_workers=2)
    executor.start()
    outcome: list[BaseException | int] = []

    def job() -> None:
        try:
            outcome.extend(executor.run(train_until, args=[10_000, 3], callbacks=[script]))
        except BaseException as error:
            outcome.append(error)

    runner = threading.Thread(target=job)
    runner.start()
    deadline = time.monotonic() + 60
    while len(script.events("step")) < 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = {m["pid"] for m in script.messages if m["event"] == "started"}
    executor.shutdown()
    runner.join(30)
    assert not runner.is_alive(), "run() still running 30 s after shutdown()"
    [error] = outcome
    assert isinstance(error, elastic.ElasticJobError)
    assert "shut down" in str(error)

    def workers_gone() -> bool:
        return not any(_running(pid) for pid in pids)

    gone_by = time.monotonic() + 30
    while not workers_gone() and time.monotonic() < gone_by:
        time.sleep(0.2)
    assert workers_gone(), f"worker processes still running 30 s after shutdown: {[p for p in pids if _running(p)]}"


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def environment_of_worker(name: str) -> str | None:
    return os.environ.get(name)


def test_extra_env_vars_reach_elastic_workers() -> None:
    discovery = StaticHostDiscovery("host-1:2")
    with elastic_executor(discovery, min_workers=2, max_workers=2) as executor:
        executor.start(extra_env_vars={"ELASTRAIN_TEST_SETTING": "from-start"})
        assert executor.run(environment_of_worker, args=["ELASTRAIN_TEST_SETTING"]) == ["from-start"] * 2


def pid_of_worker() -> int:
    return os.getpid()


def test_a_plain_function_runs_once_on_every_worker() -> None:
    """Not under elastic.run, a function joins no group: each started worker runs it, and every result returns."""
    discovery = StaticHostDiscovery("host-1:3")
    with elastic_executor(discovery, min_workers=2) as executor:
        executor.start()
        pids = executor.run(pid_of_worker)
    assert len(pids) == 3
    assert len(set(pids)) == 3


def imports_and_collector() -> tuple[bool, bool, bool]:
    import gc
    import sys

    return "torch._dynamo" in sys.modules, gc.isenabled(), gc.get_freeze_count() > 0


def test_workers_import_torch_before_they_run_with_the_collector_on_and_the_imports_frozen() -> None:
    discovery = StaticHostDiscovery("host-1:1")
    with elastic_executor(discovery, min_workers=1) as executor:
        executor.start()
        assert executor.run(imports_and_collector) == [(True, True, True)]


def test_a_module_a_worker_needs_fails_its_start_and_a_head_start_does_not() -> None:
    import ray
    import ray.exceptions

    from elastrain.executor._private.worker import Worker

    worker = ray.remote(Worker).options(num_cpus=0).remote()
    try:
        node = ray.get(worker.prepare.remote(("json",), ("elastrain_no_such_module",)), timeout=60)
        assert node.pid > 0
        with pytest.raises(ray.exceptions.RayTaskError, match="elastrain_no_such_module"):
            ray.get(worker.prepare.remote(("elastrain_no_such_module",)), timeout=60)
        collector_on = ray.get(worker.call.remote(imports_and_collector), timeout=60)[1]
        assert collector_on  # back on after a failed import too
    finally:
        ray.kill(worker, no_restart=True)


def test_shutdown_ends_a_job_still_waiting_for_min_workers() -> None:
    discovery = StaticHostDiscovery("host-1:1")
    executor = elastic_executor(discovery, min_workers=4, elastic_timeout=120)
    executor.start()
    outcome: list[BaseException | int] = []

    def job() -> None:
        try:
            outcome.extend(executor.run(pid_of_worker))
        except BaseException as error:
            outcome.append(error)

    runner = threading.Thread(target=job)
    runner.start()
    time.sleep(1.0)  # the call is now waiting for 4 slots where 1 exists
    start = time.monotonic()
    executor.shutdown()
    runner.join(30)
    assert not runner.is_alive(), "run() still waiting for slots 30 s after shutdown()"
    assert time.monotonic() - start < 30
    [error] = outcome
    assert isinstance(error, elastic.ElasticJobError)
    assert "stopped before it started" in str(error)
    assert "shut down" in str(error)


def test_every_host_blacklisted_ends_the_job_with_an_elastic_job_error() -> None:
    discovery = StaticHostDiscovery("host-1:2")
    with elastic_executor(discovery, min_workers=1) as executor:
        executor.start()
        executor._elastic.manager.blacklist("host-1")  # type: ignore[union-attr]
        with pytest.raises(elastic.ElasticJobError, match="cannot go on: Every discovered host is blacklisted"):
            executor.run(train_until, args=[5, 1])
