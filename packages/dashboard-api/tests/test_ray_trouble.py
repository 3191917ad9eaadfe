"""When Ray is slow, unreachable or newer than the dashboard: a clear 503 within the deadline, never a hung
request or a 500; and no request reads the whole actor table. Real Ray throughout: its GCS is paused with
SIGSTOP, and stand-in actors under the state actor's name play a slow and a newer state actor."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from elastrain.dashboard_api import RaySource
from elastrain.state import (
    SCHEMA_VERSION,
    STATE_ACTOR_NAME,
    STATE_ACTOR_NAMESPACE,
    RunStatus,
    TrainRunInfo,
    TrainWorkerInfo,
    get_or_create_state_actor,
)
from elastrain_testutils.waiting import wait_until

pytestmark = pytest.mark.usefixtures("no_state_actor")
# The GCS writes its request counters to its log this often (Ray's default: once a minute).
RAY_SYSTEM_CONFIG = {"event_stats_print_interval_ms": 500}
TIMEOUT_S = 1.0
WAITS = f"in time (each request waits at most {TIMEOUT_S:g} s)"


def a_run(index: int, workers: int = 3, status: RunStatus = RunStatus.FINISHED) -> dict[str, Any]:
    return TrainRunInfo(
        name="m", id=f"run-{index:04d}", job_id="01000000", run_status=status, start_time_ms=1_000 + index,
        end_time_ms=None if status is RunStatus.RUNNING else 2_000 + index,
        controller_actor_id=f"{index:024x}{99:08x}", world_size=workers,
        workers=tuple(
            TrainWorkerInfo(actor_id=f"{index:024x}{rank:08x}", world_rank=rank, local_rank=rank, node_rank=0,
                            node_id="n" * 56, node_ip="127.0.0.1", hostname="h", pid=100 + rank)
            for rank in range(workers)
        ),
    ).model_dump(mode="json")  # fmt: skip


def store(documents: list[dict[str, Any]]) -> None:
    import ray

    actor = get_or_create_state_actor()
    ray.get([actor.register_run.remote(document) for document in documents], timeout=60)


def stand_in(actor_class: type) -> Any:
    """An actor under the state actor's name; detached like the real one (the no_state_actor fixture removes it)."""
    import ray

    options = {"name": STATE_ACTOR_NAME, "namespace": STATE_ACTOR_NAMESPACE, "lifetime": "detached", "num_cpus": 0}
    options["max_concurrency"] = 4
    actor = ray.remote(actor_class).options(**options).remote()
    ray.get(actor.__ray_ready__.remote(), timeout=60)
    return actor


class GcsRequestCounts:
    """The GCS's own counts of actor-table requests, from the debug state it logs (RAY_SYSTEM_CONFIG)."""

    def __init__(self) -> None:
        import ray

        node = ray._private.worker._global_node
        self.log = Path(node.get_session_dir_path()) / "logs" / "gcs_server.out"
        self.offset = self.log.stat().st_size

    def dumps(self) -> list[tuple[int, int]]:
        """(GetActorInfo, GetAllActorInfo) of each complete dump since this object was made."""
        with open(self.log, errors="replace") as log:
            log.seek(self.offset)
            text = log.read()
        pattern = r"- GetActorInfo request count: (\d+)\n.*?- GetAllActorInfo request count: (\d+)"
        return [(int(one), int(every)) for one, every in re.findall(pattern, text, re.S)]

    def next_dump(self, at_least_point_lookups: int = 0) -> tuple[int, int]:
        return wait_until(
            lambda: next((d for d in self.dumps() if d[0] >= at_least_point_lookups), None),
            timeout_s=30,
            what="the GCS to log its request counts",
            interval_s=0.2,
        )


def test_worker_status_is_looked_up_by_id_never_by_reading_the_actor_table(serve: Any) -> None:
    # Runs still going: their workers and controllers are looked up (ended runs are shown as recorded). The state
    # actor's own check of runs going looks up their controllers too, but never reads the whole table either.
    store([a_run(index, status=RunStatus.RUNNING) for index in range(10)])
    before = GcsRequestCounts().next_dump()
    with serve() as server, httpx.Client(base_url=server.url, timeout=30) as http:
        for _ in range(3):
            page = http.get("/api/train/runs", params={"limit": 100})
            assert page.status_code == 200
            assert len(page.json()["runs"]) == 10
        run = http.get("/api/train/runs/run-0001").json()
    assert [worker["status"] for worker in run["workers"]] == ["DEAD"] * 3  # no such actors
    lookups = 3 * 10 * 4 + 4  # a worker's or controller's actor, once each
    after = GcsRequestCounts().next_dump(at_least_point_lookups=before[0] + lookups)
    assert after[1] == before[1], "a request read the whole actor table"


class NewerStateActor:
    """A state actor of a newer elastrain-state: its runs have a schema this dashboard does not know."""

    def list_runs(self, *args: Any) -> tuple[list[dict[str, Any]], None]:
        return [{**a_run(1), "schema_version": SCHEMA_VERSION + 1, "priority": "high"}], None

    def get_run(self, run_id: str) -> dict[str, Any]:
        return {**a_run(1), "priority": "high"}  # a new field under the old version number

    def info(self) -> dict[str, Any]:
        return {"by_status": {"FINISHED": 1}}


def test_runs_of_a_newer_schema_give_a_clear_503(serve: Any) -> None:
    stand_in(NewerStateActor)
    with serve() as server, httpx.Client(base_url=server.url, timeout=30) as http:
        newer = http.get("/api/train/runs")
        assert newer.status_code == 503
        assert f"schema version {SCHEMA_VERSION + 1}, newer than this dashboard reads" in newer.json()["detail"]
        assert "upgrade elastrain-dashboard-api and elastrain-state" in newer.json()["detail"]
        unknown = http.get("/api/train/runs/run-0001")
        assert unknown.status_code == 503
        assert "cannot read (priority: Extra inputs are not permitted)" in unknown.json()["detail"]
        assert http.get("/healthz").json()["tracking"]


class SlowStateActor:
    """A state actor that is there but does not answer until released."""

    def __init__(self) -> None:
        self.released = threading.Event()

    def list_runs(self, *args: Any) -> tuple[list[Any], None]:
        self.released.wait(60)
        return [], None

    def release(self) -> None:
        self.released.set()


def test_a_state_actor_that_does_not_answer_gives_503_within_the_timeout(serve: Any) -> None:
    import ray

    slow = stand_in(SlowStateActor)
    try:
        with serve(source=RaySource(timeout_s=TIMEOUT_S)) as server, httpx.Client(base_url=server.url) as http:
            response = http.get("/api/train/runs", timeout=30)
        assert response.status_code == 503
        assert f"did not answer within {TIMEOUT_S:g} s" in response.json()["detail"]
    finally:
        ray.get(slow.release.remote(), timeout=30)


@contextlib.contextmanager
def gcs_paused() -> Iterator[None]:
    """Ray's GCS stopped (SIGSTOP) for the block: every GCS request waits, calls to known actors still work."""
    import ray
    from ray._private import ray_constants

    node = ray._private.worker._global_node
    pid = node.all_processes[ray_constants.PROCESS_TYPE_GCS_SERVER][0].process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_gcs_that_does_not_answer_gives_503_within_the_timeout(serve: Any) -> None:
    source = RaySource(timeout_s=TIMEOUT_S)
    with serve(source=source) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        # No state actor yet: finding it asks the GCS (Ray keeps only names it has found).
        with gcs_paused():
            finding = http.get("/api/train/runs")
            health = http.get("/healthz").json()
        assert finding.status_code == 503
        assert f"did not answer where the state actor is {WAITS}" in finding.json()["detail"]
        assert health["status"] == "ok"
        assert not health["ray"]
        store([a_run(index, status=RunStatus.RUNNING) for index in range(2)])
        assert wait_until(lambda: http.get("/api/train/runs").status_code == 200, timeout_s=30, what="Ray again")
        # The state actor found and answering (calls to it bypass the GCS): the status of the workers of runs still
        # going asks the GCS.
        with gcs_paused():
            looking_up = http.get("/api/train/runs")
        assert looking_up.status_code == 503
        assert f"did not answer the actors' states {WAITS}" in looking_up.json()["detail"]
        assert wait_until(lambda: http.get("/api/train/runs").status_code == 200, timeout_s=30, what="Ray again")
