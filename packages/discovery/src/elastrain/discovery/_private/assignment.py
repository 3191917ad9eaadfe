"""Which host each worker rank runs on, and its local and cross ranks there."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from elastrain.discovery._private.hosts import HostInfo
from elastrain.discovery._private.validation import check_positive, check_slot_count


@dataclass(frozen=True)
class SlotInfo:
    """The placement of one worker.

    ``local_rank``/``local_size``: its index and the worker count on its host. ``cross_rank``/``cross_size``:
    among the hosts that have a worker with this ``local_rank``, the index of its host and their number
    (the ranks Horovod and torchrun's ``GROUP_RANK`` use for hierarchical collectives).
    """

    host_id: str
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def assign_slots(hosts: Mapping[str, int] | Mapping[str, HostInfo], num_workers: int) -> list[SlotInfo]:
    """Place ``num_workers`` workers on ``hosts``, filling each host before the next, in the mapping's order.

    Returns one :class:`SlotInfo` per worker, ordered by rank. A pure function: the same hosts in the same
    order always give the same placement, so callers that keep host order stable keep ranks stable.
    """
    check_positive("num_workers", num_workers, integer=True)
    slots_by_host: dict[str, int] = {}
    for host_id, entry in hosts.items():
        slots = entry.slots if isinstance(entry, HostInfo) else entry
        check_slot_count(host_id, slots, source="assign_slots")
        slots_by_host[host_id] = slots
    total = sum(slots_by_host.values())
    if num_workers > total:
        raise ValueError(
            f"Cannot place {num_workers} workers on {total} slots ({len(slots_by_host)} hosts); "
            "ask for fewer workers or add hosts."
        )

    local_sizes: dict[str, int] = {}
    left = num_workers
    for host_id, slots in slots_by_host.items():
        if left == 0:
            break
        if slots:
            local_sizes[host_id] = min(slots, left)
            left -= local_sizes[host_id]

    # Hosts that have a worker with each local rank, in host order.
    hosts_with_local_rank: dict[int, list[str]] = {}
    for host_id, local_size in local_sizes.items():
        for local_rank in range(local_size):
            hosts_with_local_rank.setdefault(local_rank, []).append(host_id)

    placements: list[SlotInfo] = []
    for host_id, local_size in local_sizes.items():
        for local_rank in range(local_size):
            cross_hosts = hosts_with_local_rank[local_rank]
            placements.append(
                SlotInfo(
                    host_id=host_id,
                    rank=len(placements),
                    size=num_workers,
                    local_rank=local_rank,
                    local_size=local_size,
                    cross_rank=cross_hosts.index(host_id),
                    cross_size=len(cross_hosts),
                )
            )
    return placements
