"""Discovery and change watching on a real multi-node ray.cluster_utils.Cluster (all nodes on this machine)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from elastrain.discovery import HostChange, HostEvent, HostManager, RayHostDiscovery
from elastrain_testutils.ray_testing import NODE_DEFAULTS, local_cluster
from elastrain_testutils.waiting import wait_until

pytestmark = pytest.mark.cluster

NODE_ARGS = {"num_cpus": 8, "num_gpus": 2}


@pytest.fixture(scope="module")
def cluster() -> Iterator[object]:
    with local_cluster(NODE_ARGS, NODE_ARGS, NODE_ARGS) as cluster:
        yield cluster


def _node_id(node: object) -> str:
    return node.node_id  # type: ignore[attr-defined, no-any-return]


def test_three_nodes_two_gpu_slots_each(cluster: object) -> None:
    hosts = RayHostDiscovery(use_gpu=True).find_available_hosts_and_slots()
    assert sorted(hosts.values()) == [2, 2, 2]
    assert set(hosts) == {_node_id(node) for node in cluster.list_all_nodes()}  # type: ignore[attr-defined]


def test_nodes_share_an_ip_but_are_distinct_hosts(cluster: object) -> None:
    hosts = RayHostDiscovery().find_available_hosts()
    assert len(hosts) == 3
    assert len({host.ip for host in hosts.values()}) == 1
    assert all(host.slots == 8 for host in hosts.values())


def test_removed_node_disappears_and_added_node_appears(cluster: object) -> None:
    events: list[HostEvent] = []
    manager = HostManager(RayHostDiscovery(use_gpu=True), poll_interval_s=0.05)
    with manager:
        assert len(manager.current_hosts) == 3
        manager.add_listener(events.extend)  # after the first poll, which reports every host as added
        order_before = list(manager.current_hosts)

        # Never the head, which the driver is attached to (Ray refuses to remove it).
        victim = list(cluster.worker_nodes)[-1]  # type: ignore[attr-defined]
        cluster.remove_node(victim)  # type: ignore[attr-defined]
        wait_until(lambda: _node_id(victim) not in manager.current_hosts, timeout_s=30, what="node removal")
        assert [(e.change, e.host_id) for e in events] == [(HostChange.REMOVED, _node_id(victim))]
        assert list(manager.current_hosts) == [h for h in order_before if h != _node_id(victim)]

        added = cluster.add_node(num_cpus=8, num_gpus=4, **NODE_DEFAULTS)  # type: ignore[attr-defined]
        wait_until(lambda: _node_id(added) in manager.current_hosts, timeout_s=60, what="node addition")
        assert events[-1].change is HostChange.ADDED
        assert events[-1].new_slots == 4
        # New hosts join at the end, so the ranks of workers on surviving hosts stay put.
        assert list(manager.current_hosts)[-1] == _node_id(added)

    # With two GPUs per worker, the 4-GPU node has 2 slots.
    two_gpu_slots = RayHostDiscovery(use_gpu=True, gpus_per_worker=2).find_available_hosts_and_slots()
    assert two_gpu_slots[_node_id(added)] == 2
    assert sorted(two_gpu_slots.values()) == [1, 1, 2]
