"""Changes in the set of usable hosts, as the host manager reports them."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from elastrain.discovery._private.hosts import HostInfo


class HostChange(enum.Enum):
    ADDED = "added"
    REMOVED = "removed"
    SLOTS_CHANGED = "slots_changed"


@dataclass(frozen=True)
class HostEvent:
    """One host that appeared, disappeared (including by blacklisting), or changed its slot count."""

    change: HostChange
    host_id: str
    old_slots: int
    new_slots: int
    host: HostInfo | None  # the host as now known; None once removed
    blacklisted: bool = False  # True when the host was removed because it was blacklisted


def diff_hosts(before: Mapping[str, HostInfo], after: Mapping[str, HostInfo]) -> list[HostEvent]:
    """Events that turn ``before`` into ``after``: removals first, then slot changes, then additions."""
    events = [
        HostEvent(HostChange.REMOVED, host_id, host.slots, 0, None)
        for host_id, host in before.items()
        if host_id not in after
    ]
    for host_id, host in after.items():
        old = before.get(host_id)
        if old is not None and old.slots != host.slots:
            events.append(HostEvent(HostChange.SLOTS_CHANGED, host_id, old.slots, host.slots, host))
    events.extend(
        HostEvent(HostChange.ADDED, host_id, 0, host.slots, host)
        for host_id, host in after.items()
        if host_id not in before
    )
    return events
