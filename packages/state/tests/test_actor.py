"""The state actor on a real local Ray: naming, concurrency, final statuses, retention, snapshots."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest

from elastrain.state import (
    STATE_ACTOR_NAME,
    STATE_ACTOR_NAMESPACE,
    RunStatus,
    RunTracker,
    TrainRunInfo,
    get_or_create_state_actor,
    get_state_actor,
)
from elastrain_testutils.waiting import wait_until

pytestmark = pytest.mark.usefixtures("no_state_actor")


def run_doc(index: int, status: str = "RUNNING", job: str = "job") -> dict[str, Any]:
    return TrainRunInfo(
        name=f"run-{index}", id=f"id-{index}", job_id=job, run_status=RunStatus(status), start_time_ms=1_000 + index
    ).model_dump(mode="json")


def all_runs(actor: Any, **filters: Any) -> list[dict[str, Any]]:
    import ray

    runs: list[dict[str, Any]] = []
    cursor = None
    while True:
        page, cursor = ray.get(actor.list_runs.remote(limit=50, cursor=cursor, **filters), timeout=30)
        runs += page
        if cursor is None:
            return runs


def test_actor_is_named_detached_and_on_the_head_node() -> None:
    import ray
    from ray._private.state import state  # Ray's actor table, read from the GCS (no dashboard here)

    assert get_state_actor() is None
    actor = get_or_create_state_actor()
    assert ray.get(actor.info.remote(), timeout=60)["runs"] == 0
    named = ray.util.list_named_actors(all_namespaces=True)
    assert {"name": STATE_ACTOR_NAME, "namespace": STATE_ACTOR_NAMESPACE} in named
    record = state.actor_table(actor._actor_id.hex())
    assert record["IsDetached"]
    assert record["Address"]["NodeID"] == ray.get_runtime_context().get_node_id()  # the head of this cluster
    assert get_state_actor() is not None


def test_many_drivers_creating_it_at_once_get_one_actor() -> None:
    import ray

    @ray.remote(num_cpus=0.1)
    def create() -> str:
        return str(get_or_create_state_actor()._actor_id.hex())

    ids = ray.get([create.remote() for _ in range(12)], timeout=120)
    assert len(set(ids)) == 1


def test_100_concurrent_registrations() -> None:
    import ray

    actor = get_or_create_state_actor()
    ray.get([actor.register_run.remote(run_doc(index)) for index in range(100)], timeout=60)
    runs = all_runs(actor)
    assert len(runs) == 100
    assert len({r["id"] for r in runs}) == 100
    assert [r["start_time_ms"] for r in runs] == sorted((r["start_time_ms"] for r in runs), reverse=True)


def test_ten_managers_with_ten_runs_each() -> None:
    import ray

    @ray.remote(num_cpus=0.1)
    def manager(index: int) -> list[str]:
        ids = []
        for run in range(10):
            tracker = RunTracker(f"manager-{index}", job_id=f"job-{index}")
            tracker.start()
            tracker.report_metrics(step=run, loss=1.0 / (run + 1))
            tracker.finish()
            ids.append(tracker.run_id)
        return ids

    ids = [i for batch in ray.get([manager.remote(i) for i in range(10)], timeout=180) for i in batch]
    actor = get_state_actor()
    runs = all_runs(actor)
    assert sorted(r["id"] for r in runs) == sorted(ids)
    assert {r["run_status"] for r in runs} == {"FINISHED"}
    assert len(all_runs(actor, job_id="job-3")) == 10
    assert all(r["latest_metrics"]["step"] == 9 for r in all_runs(actor, name="manager-0")[:1])


def test_final_statuses_are_never_taken_back() -> None:
    import ray

    actor = get_or_create_state_actor()
    tracker = RunTracker("final", actor=actor)
    tracker.start([])
    tracker.finish()
    for late in ("ABORTED", "RUNNING", "ERRORED"):
        ray.get(actor.set_status.remote(tracker.run_id, late, "late"), timeout=30)
    stored = ray.get(actor.get_run.remote(tracker.run_id), timeout=30)
    assert stored["run_status"] == "FINISHED"
    assert stored["end_time_ms"] >= stored["start_time_ms"]
    # ABORTED is not final: a late FINISHED is the truth, a late RUNNING is not.
    ray.get(actor.register_run.remote(run_doc(7)), timeout=30)
    ray.get(actor.set_status.remote("id-7", "ABORTED", "driver gone"), timeout=30)
    ray.get(actor.set_status.remote("id-7", "RUNNING"), timeout=30)
    assert ray.get(actor.get_run.remote("id-7"), timeout=30)["run_status"] == "ABORTED"
    ray.get(actor.set_status.remote("id-7", "FINISHED"), timeout=30)
    assert ray.get(actor.get_run.remote("id-7"), timeout=30)["run_status"] == "FINISHED"
    # Registering the same run again after it finished keeps the final status.
    ray.get(actor.register_run.remote(run_doc(7, "RUNNING")), timeout=30)
    assert ray.get(actor.get_run.remote("id-7"), timeout=30)["run_status"] == "FINISHED"


def test_retention_keeps_running_runs() -> None:
    import ray

    actor = get_or_create_state_actor(max_runs=20)
    ray.get(actor.register_run.remote(run_doc(0, "RUNNING")), timeout=30)
    ray.get([actor.register_run.remote(run_doc(index, "FINISHED")) for index in range(1, 40)], timeout=60)
    runs = all_runs(actor)
    assert len(runs) == 20
    assert "id-0" in {r["id"] for r in runs}
    assert min(int(r["id"][3:]) for r in runs if r["id"] != "id-0") == 21


def test_tracking_without_an_actor_goes_on() -> None:
    tracker = RunTracker("untracked", create_actor=False)
    tracker.start([])
    tracker.report_metrics(step=1, loss=0.5)
    tracker.finish()
    assert get_state_actor() is None


def test_a_broken_actor_never_fails_the_job() -> None:
    import ray

    actor = get_or_create_state_actor()
    ray.kill(actor, no_restart=True)
    tracker = RunTracker("orphan", actor=actor)
    tracker.start([])
    tracker.finish()  # the updates fail; tracking only warns


def test_a_parent_placement_group_does_not_capture_it() -> None:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    group = placement_group([{"CPU": 0.1}])
    ray.get(group.ready(), timeout=60)

    @ray.remote(num_cpus=0.1)
    def create() -> str:
        actor = get_or_create_state_actor()
        ray.get(actor.info.remote(), timeout=60)  # a captured actor would wait forever for a head node in the group
        return str(actor._actor_id.hex())

    try:
        captured = PlacementGroupSchedulingStrategy(group, placement_group_capture_child_tasks=True)
        ray.get(create.options(scheduling_strategy=captured).remote(), timeout=120)
    finally:
        remove_placement_group(group)
    actor = get_state_actor()
    where = actor.__ray_call__.remote(lambda _: ray.get_runtime_context().get_placement_group_id())
    assert ray.get(where, timeout=30) is None
    assert ray.get(actor.info.remote(), timeout=30)["runs"] == 0  # alive after the group is gone


def test_an_update_for_a_run_the_restarted_actor_lost_stores_it_again() -> None:
    import ray

    actor = get_or_create_state_actor(persist=False)  # restarts empty
    worker = {
        "actor_id": "a" * 32, "world_rank": 0, "local_rank": 0, "node_rank": 0, "node_id": "n" * 56,
        "node_ip": "10.0.0.1", "hostname": "host", "pid": 1,
    }  # fmt: skip
    tracker = RunTracker("survivor", actor=actor, min_workers=1, max_workers=2)
    tracker.start([worker])
    pid = ray.get(actor.info.remote(), timeout=60)["pid"]
    ray.kill(actor, no_restart=False)  # as if it crashed: Ray restarts it, without the run
    wait_until(lambda: _info_if_restarted(pid), timeout_s=120, what="the state actor to restart")
    tracker.report_metrics(step=3, loss=0.5)
    restarted = get_state_actor()  # held: Ray 2.40 drops a method call on a handle no name holds
    stored = ray.get(restarted.get_run.remote(tracker.run_id), timeout=30)
    assert stored["name"] == "survivor"
    assert stored["run_status"] == "RUNNING"
    assert [w["actor_id"] for w in stored["workers"]] == ["a" * 32]
    assert (stored["min_workers"], stored["max_workers"]) == (1, 2)
    assert stored["latest_metrics"]["step"] == 3
    tracker.fail("bad batch", rank=0)
    stored = ray.get(restarted.get_run.remote(tracker.run_id), timeout=30)
    assert stored["run_status"] == "ERRORED"
    assert stored["status_detail"].startswith("Rank 0 worker raised an error")


def _info_if_restarted(old_pid: int) -> dict[str, Any] | None:
    import ray

    actor = get_state_actor()
    try:
        info: dict[str, Any] = ray.get(actor.info.remote(), timeout=5)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return None
    return info if info["pid"] != old_pid else None


def test_a_run_whose_controller_died_is_aborted_and_then_retained_like_any() -> None:
    import ray

    @ray.remote(num_cpus=0)
    class Controller:
        def ready(self) -> bool:
            return True

    actor = get_or_create_state_actor(max_runs=5, driver_check_interval_s=0.2)
    controller = Controller.remote()
    ray.get(controller.ready.remote(), timeout=60)
    run = {**run_doc(0), "controller_actor_id": controller._actor_id.hex()}
    ray.get(actor.register_run.remote(run), timeout=30)
    ray.get([actor.register_run.remote(run_doc(index, "FINISHED")) for index in range(1, 5)], timeout=30)
    ray.kill(controller)
    aborted = wait_until(
        lambda: _with_status(actor, "id-0", "ABORTED"), timeout_s=60, what="the abandoned run to be ABORTED"
    )
    assert "controller actor is dead" in aborted["status_detail"]
    assert aborted["end_time_ms"] >= aborted["start_time_ms"]
    # ABORTED, it is the oldest finished run: the next run pushes it out.
    ray.get(actor.register_run.remote(run_doc(5, "FINISHED")), timeout=30)
    assert ray.get(actor.get_run.remote("id-0"), timeout=30) is None
    assert ray.get(actor.info.remote(), timeout=30)["runs"] == 5


def _with_status(actor: Any, run_id: str, status: str) -> dict[str, Any] | None:
    import ray

    run: dict[str, Any] | None = ray.get(actor.get_run.remote(run_id), timeout=30)
    return run if run is not None and run["run_status"] == status else None


ORPHANING_DRIVER = textwrap.dedent(
    """
    import os, sys
    import ray
    from elastrain.state import RunTracker, get_state_actor

    ray.init(address=sys.argv[1], log_to_driver=False)
    actor = get_state_actor()
    tracker = RunTracker("orphaned", actor=actor)
    tracker.start([])
    ray.get(actor.get_run.remote(tracker.run_id), timeout=60)  # same caller, same handle: the run has landed
    print(tracker.run_id, flush=True)
    os._exit(0)  # gone, without ending the run
    """
)


def test_a_run_whose_driver_exited_is_aborted() -> None:
    import ray

    actor = get_or_create_state_actor(driver_check_interval_s=0.2)
    ray.get(actor.info.remote(), timeout=60)
    address = ray.get_runtime_context().gcs_address
    driver = subprocess.run(
        [sys.executable, "-c", ORPHANING_DRIVER, address], capture_output=True, text=True, timeout=180, check=False
    )
    assert driver.returncode == 0, driver.stderr[-3000:]
    run_id = driver.stdout.split()[-1]
    aborted = wait_until(lambda: _with_status(actor, run_id, "ABORTED"), timeout_s=60, what="the orphaned run")
    assert "ended (its driver exited)" in aborted["status_detail"]
    assert aborted["job_id"] != ray.get_runtime_context().get_job_id()


def worker(rank: int) -> dict[str, Any]:
    return {
        "actor_id": f"{rank:032x}", "world_rank": rank, "local_rank": 0, "node_rank": rank, "node_id": "n" * 56,
        "node_ip": f"10.0.0.{rank + 1}", "hostname": f"host-{rank}", "pid": 100 + rank,
    }  # fmt: skip


def test_a_runs_history_as_the_executor_reports_it() -> None:
    """Metrics in batches, a crash, a smaller world, the end: the history, events and departed workers."""
    import ray

    from elastrain.state._private.tracker import _ExecutorRun

    actor = get_or_create_state_actor(persist=False)
    tracker = RunTracker("history", actor=actor, min_workers=1, max_workers=2)
    tracker.start([worker(0), worker(1)])
    run = _ExecutorRun(tracker)  # what the executor's observer drives
    for batch in range(20):
        run.metrics(
            [
                {"step": s, "values": {"loss": 1.0 / (s + 1)}, "time_ms": s}
                for s in range(batch * 1000, (batch + 1) * 1000)
            ]
        )
    crowded = {f"m{n}": 1.0 for n in range(40)} | {"x" * 300: 1.0}  # cut to what a run holds, not refused
    run.metrics([{"step": 20_000, "values": crowded, "time_ms": 1}])
    run.event("worker_exited", {"worker": worker(1), "status": "CRASHED", "detail": "killed by a test"})
    run.workers_changed([worker(0)], 1, 1)
    run.metrics([{"step": 19_990, "values": {"loss": 0.5}, "time_ms": 2}])  # after the rollback
    run.finished()

    page = ray.get(actor.get_metrics.remote(tracker.run_id, ["loss", "nope"]), timeout=30)
    assert (len(page["steps"]) <= 1000, page["next_after_step"]) == (True, None)
    assert (page["steps"][0], page["steps"][-1], page["stride"]) == (0, 20_000, 64)  # 32 metrics: at most 512 points
    assert (len(page["names"]), list(page["values"])) == (32, ["loss"])
    pages, after = [], None
    while True:  # the same points, 300 at a time
        part = ray.get(actor.get_metrics.remote(tracker.run_id, None, after, 300), timeout=30)
        pages += part["steps"]
        after = part["next_after_step"]
        if after is None:
            break
    assert pages == page["steps"]

    events = ray.get(actor.get_events.remote(tracker.run_id), timeout=30)["events"]
    assert [(e["kind"], e["world_size"], e["step"]) for e in events] == [
        ("WORLD_SIZE", 2, None),
        ("WORKER_EXITED", 2, 20_000),
        ("RESET", 1, 20_000),
        ("WORLD_SIZE", 1, 20_000),
        ("RUN_ENDED", 1, 19_990),
    ]
    assert (events[1]["status"], events[1]["worker"]["pid"], events[1]["detail"]) == (
        "CRASHED",
        101,
        "killed by a test",
    )
    assert events[-1]["status"] == "FINISHED"

    workers = ray.get(actor.get_workers.remote(tracker.run_id), timeout=30)
    assert [(w["pid"], w["status"]) for w in workers["workers"]] == [(100, "FINISHED")]
    [departed] = workers["departed"]
    assert (departed["pid"], departed["hostname"], departed["status"]) == (101, "host-1", "CRASHED")
    assert (departed["left_step"], departed["detail"]) == (20_000, "killed by a test")
    stored = ray.get(actor.get_run.remote(tracker.run_id), timeout=30)
    assert stored["latest_metrics"]["step"] == 19_990
    assert ray.get(actor.get_metrics.remote("no-such-run"), timeout=30) is None
