from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from elastrain_testutils.storage_servers import SeaweedS3

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session")
def seaweed() -> Iterator[SeaweedS3]:
    with SeaweedS3() as server:
        yield server


@pytest.fixture(autouse=True, scope="module")
def _test_functions_travel_by_value(request: pytest.FixtureRequest) -> None:
    """pytest imports test files under names Ray's workers cannot import: their functions travel by value."""
    from elastrain_testutils.ray_testing import ship_by_value

    ship_by_value(request.module)
