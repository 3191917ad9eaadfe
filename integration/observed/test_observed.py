"""executor + state + dashboard-api: a run shows up in the dashboard's HTTP API, served by the
``elastrain-dashboard`` command like a user runs it, with the right workers and statuses through a failure and
a resize, and with the metrics its workers sent and its events; a failing run shows as ERRORED with its error."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from kit.observing import RunView, Truth, dashboard, shown_workers
from kit.training import reference, train

from elastrain.executor import RayExecutor
from elastrain_testutils.ray_testing import NODE_DEFAULTS, local_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_cluster({"num_cpus": 2}, {"num_cpus": 2}) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def api(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    with dashboard(cluster.address, tmp_path_factory.mktemp("dashboard") / "dashboard.log") as client:
        yield client


def test_a_run_through_a_crash_and_a_new_node(cluster: Any, api: httpx.Client, tmp_path: Path) -> None:
    truth = Truth()
    stop_file = tmp_path / "stop"
    settings = RayExecutor.create_settings(timeout_s=60, discovery_interval_s=0.2)
    executor = RayExecutor(settings, min_workers=1, max_workers=3, cpus_per_worker=2, elastic_timeout=120)
    view = RunView(api, lambda: executor.last_run_id)

    def running_as_reported(size: int, resets_at_least: int = 0) -> Callable[[dict[str, Any]], bool]:
        """The API shows the run RUNNING with exactly the workers (rank, pid, node) that report themselves."""
        return lambda run: (
            run["run_status"] == "RUNNING"
            and run["world_size"] == size
            and run["resets"] >= resets_at_least
            and len(truth.workers(size)) == size
            and shown_workers(run) == truth.workers(size)
        )

    def reported() -> str:
        return f"The workers reported: {sorted(truth.workers(3))}; sizes {truth.sizes}"

    # One worker per node (2 CPUs each); Ray's Cluster must be changed from the main thread.
    with ThreadPoolExecutor(1) as pool, executor:  # on a failure the executor stops first, ending the job
        executor.start()
        job = pool.submit(executor.run, train, [100_000], {"stop_file": str(stop_file)}, [truth])
        running = view.wait(running_as_reported(2), timeout_s=90, what="2 running workers", context=reported)
        assert len({w["node_id"] for w in running["workers"]}) == 2

        # A worker is killed: the API shows its replacement (a new process) and the reset.
        killed_pid = truth.pid_of(1)
        os.kill(killed_pid, signal.SIGKILL)
        recovered = view.wait(
            lambda run: running_as_reported(2, 1)(run) and killed_pid not in {w["pid"] for w in run["workers"]},
            timeout_s=90,
            what="the replacement of the killed worker",
            context=reported,
        )
        assert recovered["resets"] >= 1

        # A node joins: the API shows 3 workers on 3 nodes.
        cluster.add_node(num_cpus=2, **NODE_DEFAULTS)
        grown = view.wait(running_as_reported(3), timeout_s=90, what="3 workers after a node joined", context=reported)
        assert len({w["node_id"] for w in grown["workers"]}) == 3

        # End the job a little ahead of every rank.
        last_step = truth.step + 100
        (tmp_path / "stop.tmp").write_text(str(last_step))
        os.replace(tmp_path / "stop.tmp", stop_file)
        results = job.result(timeout=300)

    final = view.wait(lambda run: run["run_status"] == "FINISHED", timeout_s=30, what="the run FINISHED")
    assert final["world_size"] == 3
    assert final["resets"] >= 2  # the kill and the new node at least
    assert final["end_time_ms"] >= final["start_time_ms"]
    assert {(w["world_rank"], w["pid"], w["node_id"]) for w in final["workers"]} == truth.workers(3)
    assert 1 in truth.sizes, truth.sizes
    assert truth.sizes[-1] == 3, truth.sizes
    assert len(results) == 3
    for result in results:
        assert result["weights"] == pytest.approx(reference(last_step), rel=1e-9, abs=1e-12)

    listed = api.get("/api/train/runs", params={"status": "FINISHED"}).json()["runs"]
    assert executor.last_run_id in [run["id"] for run in listed]

    # Without callbacks of their own for it, what the workers sent is the run's metric history, and the crash and
    # the resets are its events; the killed worker is listed among the departed.
    base = f"/api/train/runs/{executor.last_run_id}"
    history = api.get(f"{base}/metrics", params={"metric": "size"}).json()
    assert history["steps"][-1] == last_step
    assert history["values"]["size"][-1] == 3.0
    assert history["next_after_step"] is None  # every point in one request
    events = api.get(f"{base}/events").json()["events"]
    crashed = [e for e in events if e["kind"] == "WORKER_EXITED" and e["status"] == "CRASHED"]
    assert killed_pid in {e["worker"]["pid"] for e in crashed}, events
    assert sum(e["kind"] == "RESET" for e in events) == final["resets"]
    assert (events[-1]["kind"], events[-1]["status"]) == ("RUN_ENDED", "FINISHED")
    workers = api.get(f"{base}/workers").json()
    assert killed_pid in {w["pid"] for w in workers["departed"] if w["status"] == "CRASHED"}
    assert {w["status"] for w in workers["workers"]} == {"FINISHED"}


def fails_on_rank_1(_: Any) -> None:
    from elastrain.executor import context

    if context().rank == 1:
        raise ValueError("rank 1 has bad data")


def test_a_failing_run_shows_as_errored_with_its_error(api: httpx.Client) -> None:
    settings = RayExecutor.create_settings(timeout_s=60)
    with RayExecutor(settings, num_workers=2, cpus_per_worker=0.5) as executor:
        executor.start()
        with pytest.raises(Exception, match="bad data"):
            executor.execute(fails_on_rank_1)
        run_id = executor.last_run_id

    run = RunView(api, lambda: run_id).wait(
        lambda run: run["run_status"] == "ERRORED", timeout_s=30, what="the run ERRORED"
    )
    assert "rank 1 has bad data" in run["status_detail"]
    errored = api.get("/api/train/runs", params={"status": "ERRORED"}).json()["runs"]
    assert run_id in [r["id"] for r in errored]
    page = api.get("/")
    assert page.status_code == 200
    assert "text/html" in page.headers["content-type"]
