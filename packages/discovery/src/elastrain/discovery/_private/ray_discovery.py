"""Hosts and slots from the nodes of the Ray cluster this process is connected to."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from elastrain.discovery._private.hosts import HostDiscovery, HostDiscoveryClosedError, HostDiscoveryError, HostInfo
from elastrain.discovery._private.validation import check_positive

# Ray keeps resource quantities in fixed point with four decimals; dividing in those units avoids float
# artefacts such as 4.0 // 0.1 == 39.0.
_RAY_RESOURCE_UNITS = 10_000


def _units(quantity: float) -> int:
    return round(quantity * _RAY_RESOURCE_UNITS)


def slots_for_resources(
    resources: Mapping[str, float], *, use_gpu: bool, cpus_per_worker: float, gpus_per_worker: float
) -> int:
    """How many workers fit on a node with these total resources."""
    slots = _units(resources.get("CPU", 0.0)) // _units(cpus_per_worker)
    if use_gpu:
        slots = min(slots, _units(resources.get("GPU", 0.0)) // _units(gpus_per_worker))
    return slots


class RayHostDiscovery(HostDiscovery):
    """Every alive node of the connected Ray cluster that can take at least one worker.

    Slots count a node's *total* resources, not what is free right now: the workers this discovery plans
    for are themselves what will use them. Hosts are keyed by Ray node id.

    Before Ray is initialized it raises :class:`HostDiscoveryError`; once it has seen the cluster and Ray is
    shut down, :class:`HostDiscoveryClosedError`, on which a ``HostManager`` stops polling.
    """

    def __init__(self, use_gpu: bool = False, cpus_per_worker: float = 1, gpus_per_worker: float = 1) -> None:
        if not isinstance(use_gpu, bool):
            raise ValueError(f"use_gpu must be True or False, got {use_gpu!r}.")
        check_positive("cpus_per_worker", cpus_per_worker)
        check_positive("gpus_per_worker", gpus_per_worker)
        for name, value in (("cpus_per_worker", cpus_per_worker), ("gpus_per_worker", gpus_per_worker)):
            if _units(value) == 0:
                raise ValueError(f"{name}={value!r} is below Ray's resource precision; use at least 0.0001.")
        self.use_gpu = use_gpu
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = gpus_per_worker
        self._saw_ray = False

    def __repr__(self) -> str:
        return (
            f"RayHostDiscovery(use_gpu={self.use_gpu}, cpus_per_worker={self.cpus_per_worker}, "
            f"gpus_per_worker={self.gpus_per_worker})"
        )

    def find_available_hosts(self) -> dict[str, HostInfo]:
        hosts: dict[str, HostInfo] = {}
        for node in self._alive_nodes():
            resources: Mapping[str, float] = node.get("Resources") or {}
            slots = slots_for_resources(
                resources,
                use_gpu=self.use_gpu,
                cpus_per_worker=self.cpus_per_worker,
                gpus_per_worker=self.gpus_per_worker,
            )
            if slots > 0:
                node_id = node["NodeID"]
                hosts[node_id] = HostInfo(
                    host_id=node_id,
                    slots=slots,
                    ip=node.get("NodeManagerAddress"),
                    hostname=node.get("NodeManagerHostname"),
                    resources=dict(resources),
                )
        return hosts

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        return {host_id: host.slots for host_id, host in self.find_available_hosts().items()}

    def _alive_nodes(self) -> list[dict[str, Any]]:
        import ray  # imported here so that importing elastrain.discovery stays cheap

        if not ray.is_initialized():
            if self._saw_ray:
                raise HostDiscoveryClosedError("Ray was shut down: RayHostDiscovery has no cluster to watch any more.")
            raise HostDiscoveryError(
                "RayHostDiscovery needs a Ray connection: call ray.init() (or ray.init(address=...)) first."
            )
        try:
            nodes: list[dict[str, Any]] = ray.nodes()
        except Exception as error:
            if self._saw_ray and not ray.is_initialized():  # shut down while this poll ran
                raise HostDiscoveryClosedError("Ray was shut down while RayHostDiscovery polled it.") from error
            raise
        self._saw_ray = True
        return [node for node in nodes if node.get("Alive")]
