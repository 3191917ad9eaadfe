"""Persistence on a real local Ray: on by default, journalled, set aside when unreadable, bounded by deadlines."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from elastrain.state import SCHEMA_VERSION, RunStatus, TrainRunInfo, get_or_create_state_actor, get_state_actor
from elastrain.state._private.snapshot import Snapshots, base_name, segment_name
from elastrain.state._private.store import Store
from elastrain_testutils.waiting import wait_until

pytestmark = pytest.mark.usefixtures("no_state_actor")


def run_doc(index: int, status: str = "FINISHED") -> dict[str, Any]:
    return TrainRunInfo(
        name=f"run-{index}", id=f"id-{index}", job_id="job", run_status=RunStatus(status), start_time_ms=1_000 + index
    ).model_dump(mode="json")


def info(actor: Any) -> dict[str, Any]:
    import ray

    found: dict[str, Any] = ray.get(actor.info.remote(), timeout=30)
    return found


def loaded_info(actor: Any) -> dict[str, Any]:
    return wait_until(lambda: (i := info(actor))["snapshot"]["loaded"] and i, timeout_s=60, what="the snapshot load")


def restarted(old_pid: int) -> dict[str, Any] | None:
    import ray

    try:
        found = info(get_state_actor())
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        return None
    return found if found["pid"] != old_pid and found["snapshot"]["loaded"] else None


def test_runs_survive_a_restart_by_default_and_only_changes_are_written() -> None:
    import ray

    actor = get_or_create_state_actor(snapshot_interval_s=3600)  # rounds only when flushed
    first = loaded_info(actor)
    actor_id = actor._actor_id.hex()
    session = ray._private.worker.global_worker.node.get_session_dir_path()
    assert first["persistent"]
    assert first["snapshot"]["uri"] == os.path.join(session, "elastrain-state", actor_id)
    ray.get([actor.register_run.remote(run_doc(index)) for index in range(300)], timeout=60)
    ray.get(actor.register_run.remote(run_doc(300, "RUNNING")), timeout=30)
    ray.get(actor.flush.remote(), timeout=60)
    base = info(actor)["snapshot"]["last_write"]
    assert (base["kind"], base["runs"]) == ("base", 301)
    ray.get(actor.update_metrics.remote("id-300", 7, {"loss": 0.25}), timeout=30)
    ray.get(actor.flush.remote(), timeout=60)
    journal = info(actor)["snapshot"]
    assert (journal["last_write"]["kind"], journal["last_write"]["runs"]) == ("journal", 1)
    assert journal["last_write"]["bytes"] < base["bytes"] / 100
    ray.get(actor.flush.remote(), timeout=60)  # nothing changed: nothing written
    assert info(actor)["snapshot"]["writes"] == journal["writes"]

    ray.kill(actor, no_restart=False)  # as if it crashed: Ray restarts it, with the same folder
    again = wait_until(lambda: restarted(first["pid"]), timeout_s=120, what="the state actor to restart")
    assert again["runs"] == 301
    assert again["snapshot"]["uri"] == first["snapshot"]["uri"]
    actor = get_state_actor()  # held: Ray 2.40 drops a method call on a handle no name holds
    stored = ray.get(actor.get_run.remote("id-300"), timeout=30)
    assert stored["latest_metrics"]["step"] == 7
    history = ray.get(actor.get_metrics.remote("id-300"), timeout=30)
    assert (history["steps"], history["values"], history["retained"]) == ([7], {"loss": [0.25]}, True)


def test_version_1_snapshots_load_with_workers_that_read_how_their_run_ended(tmp_path: Path) -> None:
    import ray

    folder = tmp_path / "state"
    folder.mkdir()
    worker = {
        "actor_id": "a" * 32, "world_rank": 0, "local_rank": 0, "node_rank": 0, "node_id": "n" * 56,
        "node_ip": "10.0.0.1", "hostname": "host", "pid": 1, "gpu_ids": [], "status": "ALIVE",
    }  # fmt: skip
    runs = [{**run_doc(1), "schema_version": 1, "workers": [worker]}, {**run_doc(2, "ERRORED"), "schema_version": 1}]
    runs[1]["workers"] = [worker]
    header = {"format": "elastrain-state", "kind": "base", "schema_version": 1, "generation": 1, "runs": runs}
    (folder / base_name(1)).write_text(json.dumps(header))
    actor = get_or_create_state_actor(snapshot_uri=str(folder), snapshot_interval_s=3600)
    assert loaded_info(actor)["snapshot"]["problems"] == []
    finished, errored = (ray.get(actor.get_run.remote(f"id-{n}"), timeout=30) for n in (1, 2))
    assert (finished["schema_version"], finished["workers"][0]["status"]) == (SCHEMA_VERSION, "FINISHED")
    assert errored["workers"][0]["status"] == "STOPPED"
    assert ray.get(actor.get_metrics.remote("id-1"), timeout=30)["retained"] is False  # none was kept then


def test_runs_going_on_another_cluster_are_aborted_when_loaded(tmp_path: Path) -> None:
    """The snapshot URI outlived its cluster: the runs that were going there lost their drivers with it."""
    import ray

    folder = tmp_path / "state"
    old = Snapshots(Store(str(folder), timeout_s=30), cluster_id="ab" * 28)
    documents = [json.dumps(run_doc(1, "RUNNING")), json.dumps(run_doc(2, "FINISHED"))]
    old.write_base(5, documents)
    actor = get_or_create_state_actor(snapshot_uri=str(folder), snapshot_interval_s=3600)
    assert loaded_info(actor)["runs"] == 2
    going = ray.get(actor.get_run.remote("id-1"), timeout=30)
    assert going["run_status"] == "ABORTED"
    assert "another Ray cluster" in going["status_detail"]
    assert ray.get(actor.get_run.remote("id-2"), timeout=30)["run_status"] == "FINISHED"
    ray.get(actor.flush.remote(), timeout=60)
    here = ray._private.worker.global_worker.gcs_client.cluster_id.hex()
    assert Snapshots(Store(str(folder), timeout_s=30)).load().cluster_id == here


def unreadable_base(folder: Path, problem: str) -> None:
    folder.mkdir()
    if problem == "corrupt":
        (folder / base_name(2)).write_bytes(b'{"format": "elastrain-state", "runs": [')
    else:
        header = {"format": "elastrain-state", "kind": "base", "schema_version": SCHEMA_VERSION + 1, "runs": []}
        (folder / base_name(2)).write_text(json.dumps(header))
    (folder / segment_name(2, 1)).write_text("{}")


@pytest.mark.parametrize(
    ("problem", "message"),
    [("corrupt", "is not valid JSON"), ("newer", "written by a newer elastrain-state")],
)
def test_an_unreadable_snapshot_is_set_aside_and_the_actor_starts(tmp_path: Path, problem: str, message: str) -> None:
    import ray

    folder = tmp_path / "state"
    unreadable_base(folder, problem)
    actor = get_or_create_state_actor(snapshot_uri=str(folder), snapshot_interval_s=3600)
    found = loaded_info(actor)
    assert found["runs"] == 0
    [reported] = found["snapshot"]["problems"]
    assert message in reported
    assert "set aside in" in reported
    [aside] = [entry for entry in os.listdir(folder) if entry.startswith("set-aside-")]
    assert sorted(os.listdir(folder / aside)) == [base_name(2), segment_name(2, 1)]
    ray.get(actor.register_run.remote(run_doc(1)), timeout=30)
    ray.get(actor.flush.remote(), timeout=60)
    assert sorted(os.listdir(folder)) == sorted([aside, base_name(3)])  # the next generation, never the same name


def test_a_failed_write_leaves_no_temporary_file_and_is_written_later(tmp_path: Path) -> None:
    import ray

    folder = tmp_path / "state"
    actor = get_or_create_state_actor(snapshot_uri=str(folder), snapshot_interval_s=3600)
    ray.get(actor.register_run.remote(run_doc(1, "RUNNING")), timeout=30)
    ray.get(actor.flush.remote(), timeout=60)
    (folder / segment_name(1, 1)).mkdir()  # the next segment's name is taken: its rename fails
    ray.get(actor.set_status.remote("id-1", "FINISHED"), timeout=30)
    with pytest.raises(ray.exceptions.RayTaskError, match="Is a directory"):
        ray.get(actor.flush.remote(), timeout=60)
    assert sorted(os.listdir(folder)) == [base_name(1), segment_name(1, 1)]  # no temporary file left
    assert info(actor)["snapshot"]["failures"] == 1
    (folder / segment_name(1, 1)).rmdir()
    ray.get(actor.flush.remote(), timeout=60)
    assert info(actor)["snapshot"]["error"] is None
    assert sorted(os.listdir(folder)) == [base_name(1), segment_name(1, 2)]
    assert Snapshots(Store(str(folder), timeout_s=30)).load().runs["id-1"].run_status is RunStatus.FINISHED


def test_a_hanging_store_hits_its_deadline_and_the_actor_keeps_answering(tmp_path: Path) -> None:
    import ray

    folder = tmp_path / "state"
    folder.mkdir()
    os.mkfifo(folder / base_name(1))  # reading it blocks until someone writes: a store that hangs
    actor = get_or_create_state_actor(snapshot_uri=str(folder), io_timeout_s=0.5, snapshot_interval_s=3600)
    ray.get(actor.register_run.remote(run_doc(1)), timeout=30)
    assert len(ray.get(actor.list_runs.remote(), timeout=30)[0]) == 1
    stuck = wait_until(
        lambda: (i := info(actor))["snapshot"]["error"] and i, timeout_s=60, what="the load to hit its deadline"
    )
    assert "took longer than 0.5 s (io_timeout_s)" in stuck["snapshot"]["error"]
    assert not stuck["snapshot"]["loaded"]
    with pytest.raises(ray.exceptions.RayTaskError, match="still loading"):
        ray.get(actor.flush.remote(), timeout=60)
    assert os.listdir(folder) == [base_name(1)]  # nothing was written over what it may hold


def test_snapshot_files_are_never_seen_half_written(tmp_path: Path) -> None:
    import ray

    folder = tmp_path / "s"
    actor = get_or_create_state_actor(snapshot_uri=str(folder), snapshot_interval_s=0.05)
    stop = threading.Event()
    torn: list[str] = []

    def read() -> None:
        while not stop.is_set():
            for name in os.listdir(folder) if folder.exists() else []:
                if name.endswith(".json"):
                    try:
                        json.loads((folder / name).read_bytes())
                    except FileNotFoundError:  # compacted away meanwhile
                        pass
                    except ValueError as error:
                        torn.append(f"{name}: {error}")

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for start in range(0, 200, 20):
            ray.get([actor.register_run.remote(run_doc(index)) for index in range(start, start + 20)], timeout=60)
        ray.get(actor.flush.remote(), timeout=60)
    finally:
        stop.set()
        reader.join(10)
    assert not torn
    assert len(Snapshots(Store(str(folder), timeout_s=30)).load().runs) == 200
    assert not [name for name in os.listdir(folder) if name.endswith(".tmp")]
