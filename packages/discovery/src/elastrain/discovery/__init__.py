"""Host and slot discovery on Ray: which hosts can run workers, how many each, and how that changes.

Importing this package does not import Ray; Ray is imported when a Ray discovery first polls.
"""

from elastrain.discovery._private.assignment import SlotInfo, assign_slots
from elastrain.discovery._private.blacklist import Blacklist
from elastrain.discovery._private.events import HostChange, HostEvent
from elastrain.discovery._private.hosts import HostDiscovery, HostDiscoveryClosedError, HostDiscoveryError, HostInfo
from elastrain.discovery._private.manager import (
    AllHostsBlacklistedError,
    HostListener,
    HostManager,
    HostManagerStoppedError,
)
from elastrain.discovery._private.placement_group import PlacementGroupHostDiscovery
from elastrain.discovery._private.ray_discovery import RayHostDiscovery
from elastrain.discovery._private.script import ScriptHostDiscovery
from elastrain.discovery._private.static import StaticHostDiscovery
from elastrain.discovery._version import __version__

# Tracebacks and reprs name a class by its __module__: the public module, not where it is implemented.
for _public in (HostDiscoveryError, HostDiscoveryClosedError, AllHostsBlacklistedError, HostManagerStoppedError):
    _public.__module__ = __name__
del _public

__all__ = [
    # discoveries
    "HostDiscovery",
    "HostInfo",
    "HostDiscoveryError",
    "HostDiscoveryClosedError",
    "RayHostDiscovery",
    "PlacementGroupHostDiscovery",
    "StaticHostDiscovery",
    "ScriptHostDiscovery",
    # watching hosts
    "HostManager",
    "HostEvent",
    "HostChange",
    "HostListener",
    "Blacklist",
    "AllHostsBlacklistedError",
    "HostManagerStoppedError",
    # placing workers
    "SlotInfo",
    "assign_slots",
    "__version__",
]
