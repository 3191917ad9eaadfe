"""Cost of a RayHostDiscovery poll and of HostManager change detection, against a bare ``ray.nodes()`` call.

Runs on ray.cluster_utils.Cluster with 3 and 10 nodes. Target: both within 1.5x of ``ray.nodes()``, which is
the one cluster query a poll has to make.
"""

from __future__ import annotations

import os

import ray
from ray.cluster_utils import Cluster

from benchlib import Row, interleaved_medians, parse_args, write_results
from elastrain.discovery import HostManager, RayHostDiscovery

TARGET = 1.5
NODE_ARGS = {"num_cpus": 8, "num_gpus": 2, "object_store_memory": 80 * 1024 * 1024}


def measure(num_nodes: int, *, rounds: int, calls: int) -> list[Row]:
    cluster = Cluster(initialize_head=True, head_node_args={**NODE_ARGS, "include_dashboard": False})
    try:
        for _ in range(num_nodes - 1):
            cluster.add_node(**NODE_ARGS)
        ray.init(address=cluster.address, log_to_driver=False)
        cluster.wait_for_nodes(timeout=120)
        discovery = RayHostDiscovery(use_gpu=True)
        manager = HostManager(discovery)
        manager.refresh()
        assert len(manager.current_hosts) == num_nodes, manager.current_hosts
        medians = interleaved_medians(
            {"ray.nodes()": ray.nodes, "poll": discovery.find_available_hosts, "refresh": manager.refresh},
            rounds=rounds,
            calls=calls,
        )
    finally:
        ray.shutdown()
        cluster.shutdown()
    case = f"{num_nodes} nodes"
    raw = medians["ray.nodes()"]
    return [
        Row(case, "RayHostDiscovery poll", medians["poll"], "ray.nodes()", raw, TARGET),
        Row(case, "HostManager change detection (refresh)", medians["refresh"], "ray.nodes()", raw, TARGET),
    ]


def main() -> None:
    args = parse_args(__doc__ or "")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    rounds, calls = (5, 20) if args.quick else (25, 100)
    rows = [row for nodes in (3, 10) for row in measure(nodes, rounds=rounds, calls=calls)]
    write_results("discovery", rows, args.output, notes={"rounds": rounds, "calls_per_round": calls})


if __name__ == "__main__":
    main()
