"""What a discovery reports about one host, and the contract every discovery implements."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field

from elastrain.discovery._private.validation import check_slot_count


@dataclass(frozen=True)
class HostInfo:
    """One host that can run workers.

    ``host_id`` is the key a discovery uses for the host. On Ray it is the node id, because several nodes can
    share one IP (``ray.cluster_utils.Cluster``, containers on one machine); for static and script discovery
    it is the name the user gave. ``ip`` and ``hostname`` are ``None`` where the discovery does not know them.
    """

    host_id: str
    slots: int
    ip: str | None = None
    hostname: str | None = None
    resources: Mapping[str, float] = field(default_factory=dict, compare=False, repr=False)


class HostDiscovery(abc.ABC):
    """Finds the hosts that can run workers right now, and how many workers each can take.

    Subclasses implement :meth:`find_available_hosts_and_slots` (the contract of Horovod's ``HostDiscovery``,
    so existing discovery classes work unchanged). Discoveries that know more about their hosts also override
    :meth:`find_available_hosts`.
    """

    @abc.abstractmethod
    def find_available_hosts_and_slots(self) -> dict[str, int]:
        """Return ``{host: slots}`` for every host that can take workers now."""

    def find_available_hosts(self) -> dict[str, HostInfo]:
        """Return ``{host_id: HostInfo}``; by default built from :meth:`find_available_hosts_and_slots`."""
        hosts: dict[str, HostInfo] = {}
        for host_id, slots in self.find_available_hosts_and_slots().items():
            check_slot_count(host_id, slots, source=type(self).__name__)
            hosts[host_id] = HostInfo(host_id=host_id, slots=slots)
        return hosts


class HostDiscoveryError(RuntimeError):
    """A discovery could not tell which hosts are available (a script failed, its output was malformed)."""


class HostDiscoveryClosedError(HostDiscoveryError):
    """A discovery can no longer answer, for good: what it watched is gone (``RayHostDiscovery`` after Ray was
    shut down). A :class:`~elastrain.discovery.HostManager` whose discovery raises it stops polling quietly."""
