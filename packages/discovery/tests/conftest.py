from __future__ import annotations

from collections.abc import Iterator

import pytest

from elastrain_testutils.ray_testing import local_ray


@pytest.fixture(scope="module")
def ray_single_node() -> Iterator[None]:
    """One local Ray node with 4 CPUs and 1 (fake) GPU, shared by a test module."""
    with local_ray(num_cpus=4, num_gpus=1):
        yield
