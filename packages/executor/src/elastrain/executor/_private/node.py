"""What a worker reports about its process (kept apart from placement, so a worker imports nothing more)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NodeInfo:
    """What a worker actor reports about the process it runs in."""

    node_id: str
    node_ip: str
    hostname: str
    pid: int
    gpu_ids: tuple[str, ...]
    versions: tuple[tuple[str, str], ...] = ()  # (distribution, version) of the elastrain packages it would import
