"""schemathesis against the app's own OpenAPI schema: whatever it sends, no 5xx and responses match the schema."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from elastrain.dashboard_api import create_app
from elastrain.state import RunStatus, TrainRunInfo, get_or_create_state_actor


@pytest.fixture(scope="module")
def app(ray_4_cpus: None) -> Any:
    import ray

    actor = get_or_create_state_actor()
    runs = [
        TrainRunInfo(name=f"m{i}", id=f"r{i}", job_id="j", run_status=RunStatus.FINISHED, start_time_ms=i, end_time_ms=i)
        for i in range(30)
    ]
    ray.get([actor.register_run.remote(run.model_dump(mode="json")) for run in runs], timeout=60)
    return create_app()


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.fixture
def api_schema(app: Any) -> Any:
    return schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case: Any) -> None:
    case.call_and_validate()
