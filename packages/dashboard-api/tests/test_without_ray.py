"""With no Ray connection the API answers 503 with what to do, and the page and health check still load."""

from __future__ import annotations

from typing import Any

import httpx

from elastrain_testutils.waiting import wait_until


def test_ray_unreachable_is_503(serve: Any) -> None:
    import ray

    assert not ray.is_initialized()
    with serve() as server, httpx.Client(base_url=server.url, timeout=30) as http:
        runs = http.get("/api/train/runs")
        assert runs.status_code == 503
        assert "Not connected to a Ray cluster" in runs.json()["detail"]
        assert http.get("/api/train/runs/any").status_code == 503
        health = http.get("/healthz").json()
        assert health["status"] == "ok"
        assert not health["ray"]
        assert not health["tracking"]
        assert "elastrain_tracking_up 0" in http.get("/metrics").text
        assert http.get("/").status_code == 200


def test_calls_waiting_on_ray_are_bounded_in_time_and_number() -> None:
    import threading

    import pytest

    from elastrain.dashboard_api._private.ray_calls import BoundedCalls, RayTimeout

    calls = BoundedCalls(limit=2)
    answer = threading.Event()
    with pytest.raises(RayTimeout, match="did not answer the test in time"):
        calls.run(lambda: answer.wait(30), 0.05, "the test")
    with pytest.raises(RayTimeout, match="did not answer"):
        calls.run(lambda: answer.wait(30), 0.05, "the test")
    with pytest.raises(RayTimeout, match="2 earlier requests to Ray are still waiting"):
        calls.run(lambda: True, 5, "the test")  # refused at once: both slots wait on a silent Ray
    answer.set()

    def answered() -> str | None:
        try:
            return calls.run(lambda: "answer", 5, "the test")
        except RayTimeout:  # the two earlier calls have not handed their slots back yet
            return None

    assert wait_until(answered, timeout_s=30, what="a free slot") == "answer"
    with pytest.raises(ValueError, match="raised in the call"):
        calls.run(lambda: int("raised in the call"), 5, "the test")
