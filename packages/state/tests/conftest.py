from __future__ import annotations

from collections.abc import Iterator

import pytest

from elastrain.state import get_state_actor
from elastrain_testutils.ray_testing import local_ray, ship_by_value
from elastrain_testutils.waiting import wait_until


@pytest.fixture(scope="module")
def ray_4_cpus(request: pytest.FixtureRequest) -> Iterator[None]:
    ship_by_value(request.module)
    with local_ray(num_cpus=4):
        yield


@pytest.fixture
def no_state_actor(ray_4_cpus: None) -> Iterator[None]:
    """Each test starts without the cluster's state actor, and leaves none behind."""
    remove_state_actor()
    yield
    remove_state_actor()


def remove_state_actor() -> None:
    import ray

    actor = get_state_actor()
    if actor is not None:
        ray.kill(actor, no_restart=True)
        wait_until(lambda: get_state_actor() is None, timeout_s=30, what="the state actor to go")
