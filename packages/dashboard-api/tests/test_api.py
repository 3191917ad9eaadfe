"""The HTTP API against a real Ray, the real state actor and a real HTTP server."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import remove_state_actor

from elastrain.executor import RayExecutor, context
from elastrain.state import RunStatus, TrainRunInfo, get_or_create_state_actor
from elastrain_testutils.waiting import wait_until

pytestmark = pytest.mark.usefixtures("no_state_actor")
TOKEN = "a-long-enough-test-token"  # noqa: S105
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def hold(gate: str) -> int:
    while not os.path.exists(gate):
        time.sleep(0.02)
    return context().rank


def store_runs(count: int, **changes: Any) -> None:
    import ray

    actor = get_or_create_state_actor()
    documents = [
        TrainRunInfo(
            name=f"model-{index % 3}", id=f"run-{index:04d}", job_id=f"job-{index % 2}",
            run_status=RunStatus.FINISHED if index % 4 else RunStatus.ERRORED,
            start_time_ms=1_000 + index, end_time_ms=2_000 + index, **changes,
        ).model_dump(mode="json")
        for index in range(count)
    ]  # fmt: skip
    ray.get([actor.register_run.remote(document) for document in documents], timeout=60)


def test_a_real_job_shows_its_workers_alive_then_finished(serve: Any, tmp_path: Path) -> None:
    gate = str(tmp_path / "go")
    get_or_create_state_actor()
    with serve() as server, httpx.Client(base_url=server.url, timeout=30) as http:
        settings = RayExecutor.create_settings(timeout_s=60)
        with RayExecutor(settings, num_workers=4, cpus_per_worker=0.5) as executor:
            executor.start()
            job = threading.Thread(target=executor.run, args=[hold, [gate]])
            job.start()
            page = wait_until(lambda: http.get("/api/train/runs").json()["runs"], timeout_s=60, what="the run")
            assert len(page) == 1
            run = page[0]
            assert run["run_status"] == "RUNNING"
            assert [w["world_rank"] for w in run["workers"]] == [0, 1, 2, 3]
            assert {w["status"] for w in run["workers"]} == {"ALIVE"}
            Path(gate).write_text("")
            job.join(60)
        response = http.get(f"/api/train/runs/{run['id']}")
        assert response.status_code == 200
        done = response.json()
        assert done["run_status"] == "FINISHED"
        # Their actors are gone (the executor shut them down), yet they read how they ended, not DEAD.
        assert {w["status"] for w in done["workers"]} == {"FINISHED"}


def test_paging_through_250_runs_returns_each_once(serve: Any) -> None:
    store_runs(250)
    with serve() as server, httpx.Client(base_url=server.url, timeout=30) as http:
        seen: list[str] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 40}
            if cursor:
                params["cursor"] = cursor
            body = http.get("/api/train/runs", params=params).json()
            seen += [run["id"] for run in body["runs"]]
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert len(seen) == 250
        assert len(set(seen)) == 250
        assert seen == sorted(seen, reverse=True)  # newest first


def test_filters(serve: Any) -> None:
    store_runs(40)
    with serve() as server, httpx.Client(base_url=server.url, timeout=30) as http:
        errored = http.get("/api/train/runs", params={"status": "ERRORED", "limit": 100}).json()["runs"]
        assert len(errored) == 10
        assert {r["run_status"] for r in errored} == {"ERRORED"}
        both = http.get("/api/train/runs", params={"job_id": "job-1", "name": "model-0", "limit": 100}).json()["runs"]
        assert both
        assert all(r["job_id"] == "job-1" and r["name"] == "model-0" for r in both)


def test_a_running_run_whose_controller_is_gone_shows_aborted_at_once(serve: Any) -> None:
    """The page does not wait for the state actor's own check (every driver_check_interval_s) to record it."""
    import ray

    actor = get_or_create_state_actor()
    orphan = TrainRunInfo(
        name="orphan", id="run-0000", job_id="j", run_status=RunStatus.RUNNING, start_time_ms=1,
        controller_actor_id="ff" * 16,  # no such actor: the run's controller is gone
    )  # fmt: skip
    ray.get(actor.register_run.remote(orphan.model_dump(mode="json")), timeout=30)
    with serve() as server, httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get("/api/train/runs/run-0000").json()["run_status"] == "ABORTED"


def test_a_replaced_state_actor_is_found_again(serve: Any) -> None:
    store_runs(1)
    with serve() as server, httpx.Client(base_url=server.url, timeout=30) as http:
        assert len(http.get("/api/train/runs").json()["runs"]) == 1  # the server now keeps this actor
        remove_state_actor()
        store_runs(2)  # a new actor under the same name
        replaced = http.get("/api/train/runs")
        assert replaced.status_code == 200
        assert len(replaced.json()["runs"]) == 2


def test_errors(serve: Any) -> None:
    with serve() as server, httpx.Client(base_url=server.url, timeout=30) as http:
        off = http.get("/api/train/runs")
        assert off.status_code == 503
        assert "tracking is off" in off.json()["detail"]
        store_runs(3)
        missing = http.get("/api/train/runs/nope")
        assert missing.status_code == 404
        assert missing.json()["field"] == "run_id"
        bad_limit = http.get("/api/train/runs", params={"limit": 0})
        assert bad_limit.status_code == 422
        assert "limit" in str(bad_limit.json()["detail"])
        bad_status = http.get("/api/train/runs", params={"status": "SLEEPING"})
        assert bad_status.status_code == 422
        bad_cursor = http.get("/api/train/runs", params={"cursor": "not-ours"})
        assert bad_cursor.status_code == 400
        assert bad_cursor.json()["field"] == "cursor"
        health = http.get("/healthz").json()
        assert health["status"] == "ok"
        assert health["tracking"]


def test_metrics_are_prometheus_text(serve: Any) -> None:
    store_runs(8)
    with serve() as server, httpx.Client(base_url=server.url, timeout=30) as http:
        http.get("/api/train/runs")
        text = http.get("/metrics").text
    assert 'elastrain_runs{status="FINISHED"} 6' in text
    assert 'elastrain_runs{status="ERRORED"} 2' in text
    assert 'elastrain_http_request_duration_seconds_count{route="/api/train/runs",code="200"} 1' in text


def test_token_is_required_when_set(serve: Any) -> None:
    store_runs(1)
    with serve(token=TOKEN) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get("/api/train/runs").status_code == 401
        assert http.get("/api/train/runs", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert http.get("/api/train/runs", headers={"Authorization": f"Basic {TOKEN}"}).status_code == 401
        assert http.get("/api/train/runs/run-0000").status_code == 401
        assert http.get("/metrics").status_code == 401
        good = http.get("/api/train/runs", headers=AUTH)
        assert good.status_code == 200
        assert http.get("/").status_code == 200  # the page holds no data; its requests carry the token
        assert "access-control-allow-origin" not in good.headers  # no CORS by default
        schema = http.get("/openapi.json").json()
    assert schema["paths"]["/api/train/runs"]["get"]["security"] == [{"HTTPBearer": []}]


def guarded_paths_answer(http: httpx.Client, prefix: str) -> dict[str, int]:
    run = "/api/train/runs/run-0000"
    return {
        path: http.get(prefix + path).status_code
        for path in ("/api/train/runs", run, f"{run}/metrics", f"{run}/events", f"{run}/workers", "/metrics")
    }


def test_the_token_holds_when_mounted_under_a_prefix(serve_app: Any) -> None:
    from fastapi import FastAPI

    from elastrain.dashboard_api import create_app

    store_runs(1)
    outer = FastAPI()
    outer.mount("/dash", create_app(token=TOKEN))
    with serve_app(outer) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        assert set(guarded_paths_answer(http, "/dash").values()) == {401}
        http.headers.update(AUTH)
        assert set(guarded_paths_answer(http, "/dash").values()) == {200}


def test_the_token_holds_behind_a_proxy_root_path(serve: Any) -> None:
    store_runs(1)
    proxied = serve(token=TOKEN, server_config={"root_path": "/proxy"})
    with proxied as server, httpx.Client(base_url=server.url, timeout=30) as http:
        # The proxy strips /proxy; the app sees /proxy/api/... as its URL path, and /api/... as its route.
        assert set(guarded_paths_answer(http, "").values()) == {401}
        http.headers.update(AUTH)
        assert set(guarded_paths_answer(http, "").values()) == {200}


def test_without_a_token_only_loopback_names_are_answered(serve: Any) -> None:
    store_runs(1)
    with serve() as server, httpx.Client(base_url=server.url, timeout=30) as http:
        port = server.port
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}", "127.0.0.2"):
            assert http.get("/api/train/runs", headers={"Host": host}).status_code == 200, host
        for host in ("attacker.example", f"attacker.example:{port}", "127.0.0.1.nip.io", "[::1]:x", ""):
            for path in ("/api/train/runs", "/metrics", "/healthz", "/"):
                refused = http.get(path, headers={"Host": host})
                assert refused.status_code == 400, (host, path)
            assert refused.json()["field"] == "Host"
            assert "DNS rebinding" in refused.json()["detail"]
    with serve(allowed_hosts=["dash.example.com", "10.0.0.5"]) as server, httpx.Client(base_url=server.url) as http:
        assert http.get("/api/train/runs", headers={"Host": "dash.example.com:8266"}).status_code == 200
        assert http.get("/api/train/runs", headers={"Host": "DASH.example.com"}).status_code == 200
        assert http.get("/api/train/runs", headers={"Host": "10.0.0.5"}).status_code == 200
        assert http.get("/api/train/runs", headers={"Host": "localhost"}).status_code == 200
        assert http.get("/api/train/runs", headers={"Host": "attacker.example"}).status_code == 400
    with serve(token=TOKEN) as server, httpx.Client(base_url=server.url, timeout=30, headers=AUTH) as http:
        # A token is what the rebinding page lacks: any name is answered, and without it the answer is 401.
        assert http.get("/api/train/runs", headers={"Host": "dash.example.com"}).status_code == 200
    listed = serve(token=TOKEN, allowed_hosts=["dash.example.com"])
    with listed as server, httpx.Client(base_url=server.url, timeout=30, headers=AUTH) as http:
        assert http.get("/api/train/runs", headers={"Host": "other.example.com"}).status_code == 400


def test_refused_requests_are_counted_in_metrics(serve: Any) -> None:
    store_runs(1)
    with serve(token=TOKEN) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        for _ in range(3):
            http.get("/api/train/runs")
        http.get("/api/train/runs/run-0000", headers={"Authorization": "Bearer wrong-token-of-some-length"})
        http.get("/api/train/runs", headers=AUTH)
        text = http.get("/metrics", headers=AUTH).text
    count = "elastrain_http_request_duration_seconds_count"
    assert f'{count}{{route="/api/train/runs",code="401"}} 3' in text
    assert f'{count}{{route="/api/train/runs/{{run_id}}",code="401"}} 1' in text
    assert f'{count}{{route="/api/train/runs",code="200"}} 1' in text
    with serve() as server, httpx.Client(base_url=server.url, timeout=30) as http:
        http.get("/api/train/runs", headers={"Host": "attacker.example"})
        text = http.get("/metrics").text
    assert f'{count}{{route="unmatched",code="400"}} 1' in text


def test_nothing_secret_is_returned(serve: Any) -> None:
    store_runs(2)
    with serve() as server, httpx.Client(base_url=server.url, timeout=30) as http:
        body = http.get("/api/train/runs").text
        schema = http.get("/openapi.json").json()
    assert "environment" not in body.lower()
    assert "secret" not in body.lower()
    assert "/api/train/runs" in schema["paths"]
    assert "TrainRunInfo" in schema["components"]["schemas"]


def test_the_cli_serves_the_api_of_a_running_cluster_with_a_token_file(tmp_path: Path) -> None:
    import signal
    import socket
    import subprocess
    import sys

    import ray

    store_runs(2)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = ray.get_runtime_context().gcs_address
    command = [
        sys.executable, "-m", "elastrain.dashboard_api._private.cli", "--address", address, "--port", str(port),
        "--token-file", str(token_file),
    ]  # fmt: skip
    environment = {key: value for key, value in os.environ.items() if key != "ELASTRAIN_DASHBOARD_TOKEN"}
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=environment)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:

            def answered() -> httpx.Response | None:
                if process.poll() is not None:
                    raise AssertionError(f"the CLI exited: {process.stderr.read() if process.stderr else ''}")
                try:
                    return http.get("/api/train/runs", headers=AUTH)
                except httpx.TransportError:
                    return None

            response = wait_until(answered, timeout_s=60, what="the CLI to serve")
            assert len(response.json()["runs"]) == 2
            assert http.get("/api/train/runs").status_code == 401
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)
        if process.stderr:
            process.stderr.close()


def worker(rank: int) -> dict[str, Any]:
    return {
        "actor_id": f"{rank:032x}", "world_rank": rank, "local_rank": 0, "node_rank": rank, "node_id": "n" * 56,
        "node_ip": f"10.0.0.{rank + 1}", "hostname": f"host-{rank}", "pid": 100 + rank,
    }  # fmt: skip


def test_a_runs_metric_history_events_and_departed_workers(serve: Any) -> None:
    """The routes a chart draws from: 3,000 reported steps in one request, then in pages; events; workers."""
    from elastrain.state import RunTracker
    from elastrain.state._private.tracker import _ExecutorRun

    actor = get_or_create_state_actor()
    tracker = RunTracker("charted", actor=actor, min_workers=1, max_workers=2)
    tracker.start([worker(0), worker(1)])
    run = _ExecutorRun(tracker)  # as the executor reports
    run.metrics([{"step": s, "values": {"loss": 1.0 / (s + 1), "lr": 0.1}, "time_ms": s} for s in range(3_000)])
    run.event("worker_exited", {"worker": worker(1), "status": "CRASHED", "detail": "killed"})
    run.workers_changed([worker(0)], 1, 1)
    base = f"/api/train/runs/{tracker.run_id}"
    with serve() as server, httpx.Client(base_url=server.url, timeout=30) as http:
        whole = wait_until(
            lambda: (r := http.get(f"{base}/metrics").json())["steps"][-1:] == [2_999] and r,
            timeout_s=30,
            what="points",
        )
        assert (whole["names"], whole["stride"], whole["steps_reported"]) == (["loss", "lr"], 4, 3_000)
        assert len(whole["steps"]) == len(whole["time_ms"]) == len(whole["values"]["loss"]) <= 1000
        assert whole["next_after_step"] is None
        steps: list[int] = []
        params: dict[str, Any] = {"metric": "loss", "limit": 300}
        while True:
            page = http.get(f"{base}/metrics", params=params).json()
            assert list(page["values"]) == ["loss"]
            steps += page["steps"]
            if page["next_after_step"] is None:
                break
            params["after_step"] = page["next_after_step"]
        assert steps == whole["steps"]

        events = http.get(f"{base}/events").json()
        assert [(e["kind"], e["world_size"]) for e in events["events"]] == [
            ("WORLD_SIZE", 2),
            ("WORKER_EXITED", 2),
            ("RESET", 1),
            ("WORLD_SIZE", 1),
        ]
        assert events["events"][1]["step"] == 2_999
        later = http.get(f"{base}/events", params={"after_seq": 1, "limit": 1}).json()
        assert ([e["seq"] for e in later["events"]], later["next_after_seq"]) == ([2], 2)

        workers = http.get(f"{base}/workers").json()
        assert [(w["hostname"], w["pid"], w["status"]) for w in workers["workers"]] == [("host-0", 100, "DEAD")]
        assert [(w["pid"], w["status"], w["detail"]) for w in workers["departed"]] == [(101, "CRASHED", "killed")]
        for route in ("metrics", "events", "workers"):
            missing = http.get(f"/api/train/runs/nope/{route}")
            assert (missing.status_code, missing.json()["field"]) == (404, "run_id")
        assert http.get(f"{base}/metrics", params={"limit": 1001}).status_code == 422
