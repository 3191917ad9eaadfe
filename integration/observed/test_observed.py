"""executor + state + dashboard-api: a run shows up in the dashboard's HTTP API, served by the
``elastrain-dashboard`` command like a user runs it, with the right workers and statuses through a failure and
a resize; a failing run shows as ERRORED with its error."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from kit.observing import Truth, dashboard, fetch_run, shown_workers
from kit.training import reference, train

from elastrain.executor import RayExecutor
from elastrain_testutils.ray_testing import NODE_DEFAULTS, local_cluster
from elastrain_testutils.waiting import wait_until

STEPS = 500


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
    settings = RayExecutor.create_settings(timeout_s=60, discovery_interval_s=0.2)
    executor = RayExecutor(settings, min_workers=1, max_workers=3, cpus_per_worker=2, elastic_timeout=120)

    def run_of_this_job() -> dict[str, Any] | None:
        return fetch_run(api, executor.last_run_id)

    def shows(size: int, resets_at_least: int = 0) -> dict[str, Any] | None:
        run = run_of_this_job()
        ok = (
            run is not None
            and run["run_status"] == "RUNNING"
            and run["world_size"] == size
            and run["resets"] >= resets_at_least
            and shown_workers(run) == truth.workers(size)
            and len(truth.workers(size)) == size
        )
        return run if ok else None

    # One worker per node (2 CPUs each); Ray's Cluster must be changed from the main thread.
    with ThreadPoolExecutor(1) as pool, executor:  # on a failure the executor stops first, ending the job
        executor.start()
        job = pool.submit(executor.run, train, [STEPS], {"crash_dir": str(tmp_path)}, [truth])
        running = wait_until(lambda: shows(2), timeout_s=90, what="the API to show 2 running workers")
        assert len({w["node_id"] for w in running["workers"]}) == 2

        # A worker crashes: the API shows the replacement (a new process) and the reset.
        [crashing_pid] = [pid for rank, pid, _ in truth.workers(2) if rank == 1]
        (tmp_path / f"crash-1-{truth.step + 10}").touch()
        recovered = wait_until(
            lambda: (
                (run := shows(2, resets_at_least=1)) and crashing_pid not in {w["pid"] for w in run["workers"]} and run
            ),
            timeout_s=90,
            what="the API to show the replacement worker",
        )
        assert recovered["resets"] >= 1

        # A node joins: the API shows 3 workers on 3 nodes.
        cluster.add_node(num_cpus=2, **NODE_DEFAULTS)
        grown = wait_until(lambda: shows(3), timeout_s=90, what="the API to show 3 workers after a node joined")
        assert len({w["node_id"] for w in grown["workers"]}) == 3
        results = job.result(timeout=300)

    final = wait_until(
        lambda: (run := run_of_this_job()) and run["run_status"] == "FINISHED" and run,
        timeout_s=30,
        what="the API to show the run FINISHED",
    )
    assert final["world_size"] == 3
    assert final["resets"] >= 2  # the crash and the new node at least
    assert final["end_time_ms"] >= final["start_time_ms"]
    assert {(w["world_rank"], w["pid"], w["node_id"]) for w in final["workers"]} == truth.workers(3)
    assert 1 in truth.sizes, truth.sizes
    assert truth.sizes[-1] == 3, truth.sizes
    for result in results:
        assert result["weights"] == pytest.approx(reference(STEPS), rel=1e-9, abs=1e-12)

    listed = api.get("/api/train/runs", params={"status": "FINISHED"}).json()["runs"]
    assert executor.last_run_id in [run["id"] for run in listed]


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

    run = wait_until(
        lambda: (r := api.get(f"/api/train/runs/{run_id}").json()).get("run_status") == "ERRORED" and r,
        timeout_s=30,
        what="the API to show the run ERRORED",
    )
    assert "rank 1 has bad data" in run["status_detail"]
    errored = api.get("/api/train/runs", params={"status": "ERRORED"}).json()["runs"]
    assert run_id in [r["id"] for r in errored]
    page = api.get("/")
    assert page.status_code == 200
    assert "text/html" in page.headers["content-type"]
