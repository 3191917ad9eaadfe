"""elastrain-executor records its runs by itself when elastrain-state is installed (through an entry point)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elastrain.discovery import StaticHostDiscovery
from elastrain.executor import RayExecutor, WorkerError, context, elastic, send
from elastrain.state import get_state_actor
from elastrain_testutils.waiting import wait_until

pytestmark = pytest.mark.usefixtures("no_state_actor")


@pytest.fixture(scope="module")
def ray_4_cpus(request: pytest.FixtureRequest) -> Iterator[None]:
    from elastrain_testutils.ray_testing import local_ray, ship_by_value

    ship_by_value(request.module)
    # Scripted elastic hosts are fake node:host-N resources on this one node.
    with local_ray(num_cpus=4, resources={f"node:host-{n}": 100 for n in range(1, 4)}):
        yield


def runs_named(name: str) -> list[dict[str, Any]]:
    import ray

    actor = get_state_actor()
    if actor is None:
        return []
    page, _ = ray.get(actor.list_runs.remote(name=name, limit=100), timeout=30)
    return list(page)


def history(method: str, run_id: str) -> dict[str, Any]:
    import ray

    actor = get_state_actor()  # held: Ray 2.40 drops a method call on a handle no name holds
    found: dict[str, Any] = ray.get(getattr(actor, method).remote(run_id), timeout=30)
    return found


def where_am_i(gate: str) -> dict[str, Any]:
    import ray

    while not os.path.exists(gate):
        time.sleep(0.02)
    ctx = context()
    return {"rank": ctx.rank, "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()}


def test_a_static_job_is_running_then_finished_with_its_workers(tmp_path: Path) -> None:
    import ray

    gate = str(tmp_path / "go")
    settings = RayExecutor.create_settings(timeout_s=60)
    with RayExecutor(settings, num_workers=4, cpus_per_worker=0.5) as executor:
        executor.start()
        results: list[dict[str, Any]] = []
        job = threading.Thread(target=lambda: results.extend(executor.run(where_am_i, args=[gate])))
        job.start()
        running = wait_until(lambda: runs_named("where_am_i"), timeout_s=60, what="the run to be recorded")
        assert running[0]["run_status"] == "RUNNING"
        assert running[0]["id"] == executor.last_run_id
        Path(gate).write_text("")
        job.join(60)
    run = wait_until(
        lambda: [r for r in runs_named("where_am_i") if r["run_status"] == "FINISHED"], timeout_s=30, what="FINISHED"
    )[0]
    assert [w["world_rank"] for w in run["workers"]] == [0, 1, 2, 3]
    by_rank = {r["rank"]: r for r in results}
    for recorded in run["workers"]:
        assert recorded["pid"] == by_rank[recorded["world_rank"]]["pid"]
        assert recorded["node_id"] == by_rank[recorded["world_rank"]]["node_id"]
    assert run["world_size"] == 4
    assert {w["status"] for w in run["workers"]} == {"FINISHED"}  # not DEAD: they finished with the run
    assert run["job_id"] == ray.get_runtime_context().get_job_id()
    assert run["end_time_ms"] >= run["start_time_ms"]
    assert run["controller_actor_id"]


def fails_on_rank_two() -> None:
    if context().rank == 2:
        raise ValueError("bad batch on rank two")


def test_a_worker_that_raises_marks_the_run_errored() -> None:
    settings = RayExecutor.create_settings(timeout_s=60)
    with RayExecutor(settings, num_workers=4, cpus_per_worker=0.5) as executor:
        executor.start()
        with pytest.raises(WorkerError):
            executor.run(fails_on_rank_two)
    run = wait_until(lambda: runs_named("fails_on_rank_two"), timeout_s=30, what="the run")[0]
    assert run["run_status"] == "ERRORED"
    assert run["status_detail"].startswith("Rank 2 worker raised an error")
    assert "bad batch on rank two" in run["status_detail"]
    assert [w["status"] for w in run["workers"]] == ["STOPPED", "STOPPED", "CRASHED", "STOPPED"]
    events = history("get_events", run["id"])["events"]
    assert [(e["kind"], e["status"]) for e in events] == [
        ("WORLD_SIZE", None),
        ("WORKER_EXITED", "CRASHED"),
        ("RUN_ENDED", "ERRORED"),
    ]
    assert (events[1]["worker"]["world_rank"], events[1]["detail"]) == (2, "ValueError: bad batch on rank two")


def test_tracking_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELASTRAIN_TRACKING", "0")
    settings = RayExecutor.create_settings(timeout_s=60)
    with RayExecutor(settings, num_workers=2, cpus_per_worker=0.5) as executor:
        executor.start()
        executor.run(context)
    assert get_state_actor() is None


def grow_then_finish(steps_at_three: int) -> int:
    import torch
    import torch.distributed as dist

    state = elastic.ObjectState(step=0, at_three=0)

    @elastic.run
    def train(state: elastic.ObjectState) -> int:
        while state.at_three < steps_at_three:
            value = torch.ones(1)
            dist.all_reduce(value)
            state.step += 1
            state.at_three += int(dist.get_world_size() == 3)
            send({"size": dist.get_world_size()})
            time.sleep(0.02)
            state.commit()
        return int(state.step)

    return int(train(state))


def test_an_elastic_jobs_workers_change_after_a_resize() -> None:
    discovery = StaticHostDiscovery({"host-1": 1})
    settings = RayExecutor.create_settings(timeout_s=60, discovery=discovery, discovery_interval_s=0.05)
    sizes: list[int] = []
    with RayExecutor(settings, min_workers=1, max_workers=3, cpus_per_worker=0.25, override_discovery=False) as ex:
        ex.start()

        def on_message(message: dict[str, Any]) -> None:
            sizes.append(message["size"])
            if len(sizes) == 20:
                discovery.set_hosts({"host-1": 1, "host-2": 2})

        ex.run(grow_then_finish, args=[30], callbacks=[on_message])
        run_id = ex.last_run_id
    run = wait_until(
        lambda: [r for r in runs_named("grow_then_finish") if r["run_status"] == "FINISHED"],
        timeout_s=30,
        what="FINISHED",
    )[0]
    assert run["id"] == run_id
    assert run["world_size"] == 3
    assert [w["world_rank"] for w in run["workers"]] == [0, 1, 2]
    assert run["resets"] >= 1
    assert run["min_workers"] == 1
    assert run["max_workers"] == 3
    assert sizes[0] == 1
    assert sizes[-1] == 3
    assert {w["status"] for w in run["workers"]} == {"FINISHED"}
    # What the workers sent reached the history without a step of its own (each report the next step), and the
    # world's changes are events.
    metrics = history("get_metrics", run_id)
    assert metrics["names"] == ["size"]
    assert metrics["steps"][:5] == [0, 1, 2, 3, 4]
    assert metrics["values"]["size"][-1] == 3.0
    kinds = [(e["kind"], e["world_size"]) for e in history("get_events", run_id)["events"]]
    assert kinds[0] == ("WORLD_SIZE", 1)
    assert ("RESET", 3) in kinds
    assert ("WORLD_SIZE", 3) in kinds
    assert kinds[-1] == ("RUN_ENDED", 3)
