"""A world: one generation of an elastic job's worker group, as the driver publishes it."""

from __future__ import annotations

from dataclasses import dataclass

from elastrain.discovery import SlotInfo


@dataclass(frozen=True)
class Member:
    """One worker of a world: its stable id (kept across resets) and its placement in this world."""

    worker_id: str
    slot: SlotInfo
    node_rank: int
    num_nodes: int


@dataclass(frozen=True)
class World:
    """Generation ``generation`` of the group; ``members`` are ordered by rank."""

    generation: int
    members: tuple[Member, ...]

    @property
    def size(self) -> int:
        return len(self.members)

    def member(self, worker_id: str) -> Member | None:
        for member in self.members:
            if member.worker_id == worker_id:
                return member
        return None
