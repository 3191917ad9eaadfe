from __future__ import annotations

from collections.abc import Iterator

import pytest

from elastrain_testutils.ray_testing import local_ray, ship_by_value


@pytest.fixture(scope="module")
def ray_4_cpus() -> Iterator[None]:
    """One local Ray node with 4 CPUs, shared by a test module."""
    with local_ray(num_cpus=4):
        yield


@pytest.fixture(autouse=True, scope="module")
def _functions_travel_by_value(request: pytest.FixtureRequest) -> None:
    ship_by_value(request.module)
