"""With no Ray connection the API answers 503 with what to do, and the page and health check still load."""

from __future__ import annotations

from typing import Any

import httpx


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
