from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# A test cluster on a 2-core machine: no dashboard, little object store, no usage stats prompt.
RAY_TEST_ARGS = {"include_dashboard": False, "object_store_memory": 80 * 1024 * 1024}
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="module")
def ray_single_node() -> Iterator[None]:
    """One local Ray node with 4 CPUs and 1 (fake) GPU, shared by a test module."""
    import ray

    ray.init(num_cpus=4, num_gpus=1, **RAY_TEST_ARGS)
    try:
        yield
    finally:
        ray.shutdown()
