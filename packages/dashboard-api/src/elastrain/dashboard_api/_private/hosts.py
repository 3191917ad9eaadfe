"""Which ``Host`` headers the server answers: its defence against DNS rebinding.

A page on another site can point its own host name at 127.0.0.1 and then read this server as if it were that
site, since the browser sees the same origin. Such requests carry the other site's name in ``Host``; a server
that answers only to names that cannot be repointed (loopback names, or names the operator lists) is out of
reach. With a bearer token the attack gains nothing (the other page has no token), so any name is answered
unless a list is given.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

# One DNS label: letters, digits and inner hyphens, at most 63 characters.
_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


def is_loopback(host: str) -> bool:
    """Whether a host name or address (no port) means this machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_allowed_hosts(entries: Iterable[str]) -> frozenset[str]:
    """Host names and IP addresses, normalised; ``ValueError`` naming the first bad entry and what to write."""
    if isinstance(entries, str):
        raise ValueError(f"allowed_hosts must be a list of host names, got the string {entries!r}: wrap it in a list")
    allowed = set()
    for entry in entries:
        allowed.add(_parse_entry(entry))
    return frozenset(allowed)


def _parse_entry(entry: object) -> str:
    if not isinstance(entry, str):
        raise ValueError(f"allowed hosts must be strings, got {entry!r}")
    shown = f"allowed host {entry!r}"
    if not entry:
        raise ValueError(f"{shown} is empty: remove it (e.g. a doubled or trailing comma)")
    if entry != entry.strip():
        raise ValueError(f"{shown} has spaces around it: remove them")
    if "://" in entry or "/" in entry:
        raise ValueError(f"{shown} is a URL: give the host name alone, like 'dashboard.example.com'")
    if "*" in entry:
        raise ValueError(f"{shown} has a wildcard: list each host name the dashboard is reached by")
    address = _address(entry)
    if address is not None:
        return address
    if ":" in entry:
        raise ValueError(f"{shown} has a port: give the host name alone (any port is answered)")
    name = entry.lower().removesuffix(".")
    if len(name) > 253 or not all(_LABEL.match(label) for label in name.split(".")):
        raise ValueError(
            f"{shown} is not a host name or IP address: use letters, digits, hyphens and dots, "
            "like 'dashboard.example.com' or '10.0.0.5'"
        )
    return name


def _address(text: str) -> str | None:
    """An IP address in its canonical form (IPv6 with or without brackets), or None."""
    bracketed = text.startswith("[") and text.endswith("]")
    try:
        return str(ipaddress.ip_address(text[1:-1] if bracketed else text))
    except ValueError:
        return None


def host_of(header: str) -> str | None:
    """The host in a ``Host`` header, normalised and without its port; None when the header is malformed."""
    header = header.strip().lower()
    if header.startswith("["):  # [IPv6]:port
        inside, bracket, rest = header[1:].partition("]")
        if not bracket or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return _address(inside)
    name, colon, port = header.partition(":")
    if colon and not port.isdigit():
        return None
    return _address(name) or (name.removesuffix(".") or None)


class HostPolicy:
    """Answer every host (``allowed`` None) or loopback names plus the ``allowed`` ones."""

    def __init__(self, allowed: frozenset[str] | None) -> None:
        self.allowed = allowed

    @classmethod
    def build(cls, allowed_hosts: Iterable[str] | None, *, token_set: bool) -> HostPolicy:
        if allowed_hosts is not None:
            return cls(parse_allowed_hosts(allowed_hosts))
        return cls(None if token_set else frozenset())

    def allows(self, header: str | None) -> bool:
        if self.allowed is None:
            return True
        host = host_of(header or "")
        return host is not None and (is_loopback(host) or host in self.allowed)

    def refusal(self, header: str | None) -> str:
        return (
            f"This dashboard does not answer to host {(header or '')[:100]!r}, a guard against DNS rebinding: open "
            "it as http://127.0.0.1:<port>/ or http://localhost:<port>/, or start it with that host in allowed_hosts "
            "(--allowed-hosts) or with a token."
        )
