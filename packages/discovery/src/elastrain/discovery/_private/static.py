"""Discovery from a fixed host list that the caller may replace while a job runs."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from elastrain.discovery._private.hosts import HostDiscovery
from elastrain.discovery._private.validation import check_slot_count


def parse_host_spec(spec: str, *, source: str, default_slots: int | None = None) -> dict[str, int]:
    """Parse ``host:slots`` entries separated by commas or newlines, as Horovod's ``-H`` and discovery scripts.

    Blank lines and ``#`` comments are skipped. A bare ``host`` takes ``default_slots`` when one is given.
    """
    hosts: dict[str, int] = {}
    entries = (entry for line in spec.splitlines() for entry in line.split("#", 1)[0].split(","))
    for raw in entries:
        entry = raw.strip()
        if not entry:
            continue
        host, sep, slots_text = entry.rpartition(":")
        if not sep:
            host, slots_text = entry, ""
        if not host or any(c.isspace() for c in host):
            raise ValueError(f"{source}: malformed entry {entry!r}; expected 'host:slots', e.g. 'node1:4'.")
        if slots_text:
            try:
                slots = int(slots_text)
            except ValueError:
                raise ValueError(f"{source}: slots in {entry!r} must be an integer, e.g. '{host}:4'.") from None
        elif default_slots is not None:
            slots = default_slots
        else:
            raise ValueError(f"{source}: entry {entry!r} has no slot count; write it as '{host}:<slots>'.")
        if host in hosts:
            raise ValueError(f"{source}: host {host!r} is listed twice; list each host once.")
        check_slot_count(host, slots, source=source)
        hosts[host] = slots
    return hosts


class StaticHostDiscovery(HostDiscovery):
    """A fixed set of hosts: ``StaticHostDiscovery({"h1": 2, "h2": 1})`` or ``StaticHostDiscovery("h1:2,h2:1")``.

    :meth:`set_hosts` replaces the set, which is how tests and custom controllers script cluster changes.
    Hosts with 0 slots are omitted from what the discovery reports.
    """

    def __init__(self, hosts: Mapping[str, int] | str) -> None:
        self._lock = threading.Lock()
        self._hosts = self._validated(hosts)

    def __repr__(self) -> str:
        return f"StaticHostDiscovery({self.find_available_hosts_and_slots()!r})"

    def set_hosts(self, hosts: Mapping[str, int] | str) -> None:
        validated = self._validated(hosts)
        with self._lock:
            self._hosts = validated

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        with self._lock:
            return {host: slots for host, slots in self._hosts.items() if slots > 0}

    @staticmethod
    def _validated(hosts: Mapping[str, int] | str) -> dict[str, int]:
        if isinstance(hosts, str):
            return parse_host_spec(hosts, source="StaticHostDiscovery")
        if not isinstance(hosts, Mapping):
            raise ValueError(
                f"StaticHostDiscovery takes a mapping {{host: slots}} or a string 'h1:2,h2:1', "
                f"got {type(hosts).__name__}."
            )
        for host, slots in hosts.items():
            check_slot_count(host, slots, source="StaticHostDiscovery")
        return dict(hosts)
