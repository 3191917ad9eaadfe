"""Ray for tests on a 2-core machine: no dashboard, a small object store, always shut down."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

OBJECT_STORE_BYTES = 80 * 1024 * 1024
NODE_DEFAULTS: dict[str, Any] = {"object_store_memory": OBJECT_STORE_BYTES}

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@contextlib.contextmanager
def local_ray(**init_args: Any) -> Iterator[None]:
    """A single-node local Ray for the duration of the block (e.g. ``local_ray(num_cpus=4, num_gpus=1)``)."""
    import ray

    # "local": always a fresh instance, never a cluster some other process on this machine happens to run.
    ray.init(address="local", include_dashboard=False, **NODE_DEFAULTS, **init_args)
    try:
        yield
    finally:
        ray.shutdown()


@contextlib.contextmanager
def local_cluster(*nodes: dict[str, Any]) -> Iterator[Any]:
    """A ``ray.cluster_utils.Cluster`` with one node per argument (the first is the head), connected."""
    import ray
    from ray.cluster_utils import Cluster

    head, *others = nodes
    cluster = Cluster(initialize_head=True, head_node_args={**NODE_DEFAULTS, "include_dashboard": False, **head})
    try:
        # The driver joins before the other nodes exist, so its raylet is the head's. With several raylets on one
        # host, Ray before 2.60 attaches a driver to any of them, and a test that then removes "a worker node"
        # may remove the driver's own: its process exits with status 1 and no word (seen on Ray 2.40).
        ray.init(address=cluster.address)
        for node in others:
            cluster.add_node(**NODE_DEFAULTS, **node)
        cluster.wait_for_nodes(timeout=60)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def ship_by_value(module: ModuleType) -> None:
    """Make Ray pickle functions and classes of a test module by value.

    pytest imports test files under names (``test_static_jobs``) that Ray's worker processes cannot import,
    so functions defined in them must travel by value.
    """
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(module)
