"""PlacementGroupHostDiscovery on a real 2-node ray.cluster_utils.Cluster: hosts are the nodes a placement group's
bundles are on, slots the workers those bundles hold; a removed group and a shut-down Ray end the watch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from elastrain.discovery import HostDiscoveryClosedError, PlacementGroupHostDiscovery
from elastrain_testutils.ray_testing import local_cluster

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with local_cluster({"num_cpus": 1}, {"num_cpus": 2}, {"num_cpus": 2}) as cluster:
        yield cluster


@pytest.fixture
def group(cluster: Any) -> Iterator[Any]:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    # A driver bundle too small for a worker, then two workers' bundles and one bundle holding two workers.
    group = placement_group([{"CPU": 0.1}, {"CPU": 1}, {"CPU": 1}, {"CPU": 2}], strategy="SPREAD")
    ray.get(group.ready(), timeout=60)
    yield group
    remove_placement_group(group)


def test_hosts_are_the_nodes_of_the_bundles_that_hold_workers(group: Any) -> None:
    from ray.util.placement_group import placement_group_table

    discovery = PlacementGroupHostDiscovery(group, cpus_per_worker=1)
    assert discovery.bundle_slots == {1: 1, 2: 1, 3: 2}  # the driver's bundle holds no worker
    assert discovery.total_slots == 4
    placed = placement_group_table(group)["bundles_to_node_id"]
    expected: dict[str, int] = {}
    for index, slots in discovery.bundle_slots.items():
        expected[placed[index]] = expected.get(placed[index], 0) + slots
    assert discovery.find_available_hosts_and_slots() == expected
    for host in expected:
        assert discovery.bundles_on(host) == {i: s for i, s in discovery.bundle_slots.items() if placed[i] == host}


def test_excluded_bundles_do_not_count(group: Any) -> None:
    discovery = PlacementGroupHostDiscovery(group, cpus_per_worker=0.1, exclude_bundles={0, 3})
    assert discovery.bundle_slots == {1: 10, 2: 10}


def test_a_removed_group_ends_the_watch(cluster: Any) -> None:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group([{"CPU": 1}])
    ray.get(group.ready(), timeout=60)
    discovery = PlacementGroupHostDiscovery(group)
    assert sum(discovery.find_available_hosts_and_slots().values()) == 1
    remove_placement_group(group)
    with pytest.raises(HostDiscoveryClosedError, match="placement group was removed"):
        discovery.find_available_hosts_and_slots()


@pytest.mark.parametrize(
    ("group", "kwargs", "message"),
    [
        ("not a group", {}, "placement_group must be a ray.util.placement_group.PlacementGroup"),
        (None, {}, "placement_group must be a ray.util.placement_group.PlacementGroup"),
    ],
)
def test_bad_arguments(group: Any, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PlacementGroupHostDiscovery(group, **kwargs)


def test_bad_worker_sizes(group: Any) -> None:
    with pytest.raises(ValueError, match="use_gpu must be True or False"):
        PlacementGroupHostDiscovery(group, use_gpu="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cpus_per_worker"):
        PlacementGroupHostDiscovery(group, cpus_per_worker=0)
