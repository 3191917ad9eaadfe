"""Hosts and slots inside one Ray placement group: the nodes its bundles are placed on right now.

A job that runs in a placement group it was given (a Ray Tune trial's, say) may use only that group's bundles.
When a node dies, Ray re-places the bundles that were on it as soon as some node has room; until then those
bundles have no node, and the hosts reported here shrink. Slots are counted per bundle (how many workers fit in
it), so workers can be pinned to a bundle with room (:meth:`PlacementGroupHostDiscovery.bundles_on`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from elastrain.discovery._private.hosts import HostDiscovery, HostDiscoveryClosedError, HostDiscoveryError, HostInfo
from elastrain.discovery._private.ray_discovery import slots_for_resources
from elastrain.discovery._private.validation import check_positive


class PlacementGroupHostDiscovery(HostDiscovery):
    """The nodes that hold bundles of ``placement_group``, with as many slots as workers fit in those bundles.

    ``exclude_bundles``: bundle indexes not to count (the one the calling process itself runs in).
    """

    def __init__(
        self,
        placement_group: Any,
        *,
        use_gpu: bool = False,
        cpus_per_worker: float = 1,
        gpus_per_worker: float = 1,
        exclude_bundles: frozenset[int] | set[int] = frozenset(),
    ) -> None:
        if not hasattr(placement_group, "bundle_specs") or not hasattr(placement_group, "id"):
            raise ValueError(
                f"placement_group must be a ray.util.placement_group.PlacementGroup, got {placement_group!r}."
            )
        if not isinstance(use_gpu, bool):
            raise ValueError(f"use_gpu must be True or False, got {use_gpu!r}.")
        check_positive("cpus_per_worker", cpus_per_worker)
        check_positive("gpus_per_worker", gpus_per_worker)
        self.placement_group = placement_group
        self.use_gpu = use_gpu
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = gpus_per_worker
        self.exclude_bundles = frozenset(exclude_bundles)
        # Slots of each bundle, from its shape; bundles with none (the caller's own, a driver's) never count.
        self.bundle_slots: dict[int, int] = {}
        for index, spec in enumerate(placement_group.bundle_specs):
            slots = slots_for_resources(
                spec, use_gpu=use_gpu, cpus_per_worker=cpus_per_worker, gpus_per_worker=gpus_per_worker
            )
            if slots > 0 and index not in self.exclude_bundles:
                self.bundle_slots[index] = slots
        self._placed: dict[int, str] = {}
        self._saw_ray = False

    def __repr__(self) -> str:
        return (
            f"PlacementGroupHostDiscovery({self.placement_group.id.hex()[:12]}, bundles={sorted(self.bundle_slots)}, "
            f"cpus_per_worker={self.cpus_per_worker}, use_gpu={self.use_gpu})"
        )

    @property
    def total_slots(self) -> int:
        """Slots of every worker bundle, placed or not: the most workers this group can ever hold."""
        return sum(self.bundle_slots.values())

    def bundles_on(self, host_id: str) -> dict[int, int]:
        """``{bundle index: slots}`` of the bundles placed on ``host_id`` at the last poll."""
        return {index: self.bundle_slots[index] for index, node in self._placed.items() if node == host_id}

    def find_available_hosts(self) -> dict[str, HostInfo]:
        import ray  # imported here so that importing elastrain.discovery stays cheap
        from ray.util.placement_group import placement_group_table

        if not ray.is_initialized():
            if self._saw_ray:
                raise HostDiscoveryClosedError("Ray was shut down: the placement group has no cluster any more.")
            raise HostDiscoveryError("PlacementGroupHostDiscovery needs a Ray connection: call ray.init() first.")
        table: Mapping[str, Any] = placement_group_table(self.placement_group)
        self._saw_ray = True
        if table.get("state") == "REMOVED":
            raise HostDiscoveryClosedError("The placement group was removed: its job has no hosts any more.")
        alive = {node["NodeID"]: node for node in ray.nodes() if node.get("Alive")}
        placed = {
            int(index): node_id
            for index, node_id in (table.get("bundles_to_node_id") or {}).items()
            if int(index) in self.bundle_slots and node_id in alive
        }
        self._placed = placed
        hosts: dict[str, HostInfo] = {}
        for index, node_id in sorted(placed.items()):
            slots = self.bundle_slots[index] + (hosts[node_id].slots if node_id in hosts else 0)
            node = alive[node_id]
            hosts[node_id] = HostInfo(
                host_id=node_id,
                slots=slots,
                ip=node.get("NodeManagerAddress"),
                hostname=node.get("NodeManagerHostname"),
                resources=dict(node.get("Resources") or {}),
            )
        return hosts

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        return {host_id: host.slots for host_id, host in self.find_available_hosts().items()}
