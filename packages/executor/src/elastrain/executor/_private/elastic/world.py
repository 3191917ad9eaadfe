"""A world: one generation of an elastic job's worker group, as the driver publishes it."""

from __future__ import annotations

import functools
import pickle
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from elastrain.discovery import SlotInfo, assign_slots


class Candidate(Protocol):
    """What forming a world needs to know of a worker."""

    @property
    def worker_id(self) -> str: ...
    @property
    def host_id(self) -> str: ...
    @property
    def joined(self) -> bool: ...


@dataclass(frozen=True)
class Member:
    """One worker of a world: its stable id (kept across resets) and its placement in this world."""

    worker_id: str
    slot: SlotInfo
    node_rank: int
    num_nodes: int


@dataclass(frozen=True)
class World:
    """Generation ``generation`` of the group; ``members`` are ordered by rank.

    ``held``: workers of an earlier group that this one leaves out although they are alive, because the job forms
    groups of whole multiples of its ``size_multiple`` only. They wait, keeping their process, for a group with
    room for them; any other earlier member left out learns that it was dropped.
    """

    generation: int
    members: tuple[Member, ...]
    held: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return len(self.members)

    def member(self, worker_id: str) -> Member | None:
        for member in self.members:
            if member.worker_id == worker_id:
                return member
        return None


@dataclass(frozen=True)
class PackedWorld:
    """A world as the rendezvous actor hands it to joining workers: pickled once when published.

    Every member of a world joins it, and each answer used to pickle the whole world again: at 1,024 members,
    10 ms of the actor's CPU per answer, 10 s per group formed (benchmarks/scale). Bytes cost Ray a copy.
    """

    generation: int
    data: bytes

    @classmethod
    def of(cls, world: World) -> PackedWorld:
        return cls(world.generation, pickle.dumps(world, protocol=pickle.HIGHEST_PROTOCOL))

    def unpack(self) -> World:
        """The world; unpickled once per process (a process that simulates many workers asks for it many times)."""
        with _unpacked_lock:
            world = _unpacked.get(self.data)
            if world is None:
                world = pickle.loads(self.data)  # noqa: S301 - pickled by this job's own rendezvous actor
                _unpacked.clear()  # only the newest is asked for again
                _unpacked[self.data] = world
        return world


_unpacked: dict[bytes, World] = {}
_unpacked_lock = threading.Lock()


def make_world(generation: int, workers: Sequence[Candidate], host_order: list[str], held: Sequence[str] = ()) -> World:
    """Ranks by host (hosts in discovery order), previous members before newcomers on each host.

    Which worker's state the group takes is decided by the workers when they sync (most commits wins).
    """
    position = {host: i for i, host in enumerate(host_order)}
    ordered = sorted(
        workers, key=lambda w: (position.get(w.host_id, len(position)), not w.joined, _natural(w.worker_id))
    )
    by_host: dict[str, list[Candidate]] = {}
    for worker in ordered:
        by_host.setdefault(worker.host_id, []).append(worker)
    slots = assign_slots({host: len(ws) for host, ws in by_host.items()}, len(ordered))
    node_rank = {host: i for i, host in enumerate(by_host)}
    taken = dict.fromkeys(by_host, 0)
    members = []
    for slot in slots:
        worker = by_host[slot.host_id][taken[slot.host_id]]
        taken[slot.host_id] += 1
        members.append(Member(worker.worker_id, slot, node_rank[slot.host_id], len(by_host)))
    return World(generation, tuple(members), tuple(held))


@functools.lru_cache(maxsize=1 << 16)  # every publish sorts every worker again; ids are parsed once
def _natural(worker_id: str) -> tuple[str, int]:
    """Order ids by their number (``w2`` before ``w10``), in the order the driver started the workers."""
    stem = worker_id.rstrip("0123456789")
    digits = worker_id[len(stem) :]
    return stem, int(digits) if digits else -1
