"""Which committed shards a new world loads, and who sends each piece: pure functions, the same on every member.

A sharded state is a set of tensors, each cut into chunks (a global offset and a shape) that live on different
ranks. A member can hold chunks of several saved versions: its own committed copies, and its ward's (the rank
whose copy it keeps in memory). At a reset every member states what it holds (:class:`Holding`) and which chunks
the new world's layout gives it (:class:`Target`); every member then derives the same :class:`ShardPlan` from the
same lists: the newest version whose chunks are all still held somewhere, and one sender for each piece every
target needs. No member can take a branch another does not, so none is left waiting in a transfer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (global offset, shape)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the state: its whole shape and dtype (the same in every layout)."""

    global_shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Holding:
    """One saved version a member holds chunks of.

    ``version`` numbers saves in the order the job made them (the members of a world save in lockstep, so the
    same number means the same state); ``commits`` is the commit count that version stands for; ``replicated``
    says this member also holds the version's replicated part (plain values, optimizer settings, samplers).
    """

    version: int
    commits: int
    chunks: Mapping[str, tuple[Box, ...]]
    tensors: Mapping[str, TensorInfo]
    replicated: bool


@dataclass(frozen=True)
class Piece:
    """``box`` of tensor ``key`` goes from ``source`` (out of its chunk ``from_chunk``) to ``target`` (into its
    chunk ``to_chunk``). When ``source == target`` it is a local copy."""

    key: str
    source: int
    target: int
    box: Box
    from_chunk: Box
    to_chunk: Box

    @property
    def numel(self) -> int:
        return math.prod(self.box[1])


@dataclass(frozen=True)
class ShardPlan:
    """What the reset loads: ``version`` (None when no version is whole), and how it moves."""

    version: int | None
    commits: int
    replicated_source: int  # the member that broadcasts the version's replicated part (-1: none)
    pieces: tuple[Piece, ...] = ()
    missing: Mapping[str, int] = field(default_factory=dict)  # for the newest version: elements no one holds

    def pieces_between(self, source: int, target: int) -> list[Piece]:
        return [p for p in self.pieces if p.source == source and p.target == target]


def volume(box: Box) -> int:
    return math.prod(box[1])


def overlap(a: Box, b: Box) -> Box | None:
    """The box two boxes share, or None."""
    offset, shape = [], []
    for a_start, a_size, b_start, b_size in zip(a[0], a[1], b[0], b[1], strict=True):
        start, end = max(a_start, b_start), min(a_start + a_size, b_start + b_size)
        if end <= start:
            return None
        offset.append(start)
        shape.append(end - start)
    return tuple(offset), tuple(shape)


def distinct_chunks(holdings: Sequence[Holding | None], version: int, key: str) -> dict[Box, list[int]]:
    """Every distinct chunk of ``key`` at ``version``, with the ranks holding it (a replica's chunk is one chunk)."""
    found: dict[Box, list[int]] = {}
    for rank, holding in enumerate(holdings):
        if holding is None or holding.version != version:
            continue
        for box in holding.chunks.get(key, ()):
            if volume(box):
                found.setdefault(box, []).append(rank)
    return found


def missing_elements(info: TensorInfo, chunks: Iterable[Box]) -> int:
    """How many elements of a tensor the chunks leave uncovered; raises if distinct chunks overlap (a layout
    elastrain cannot split pieces of)."""
    boxes = list(chunks)
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            if overlap(a, b) is not None:
                raise ValueError(f"Chunks {a} and {b} of one saved version overlap; every layout must partition.")
    return math.prod(info.global_shape) - sum(volume(b) for b in boxes)


def whole_versions(held: Sequence[Sequence[Holding]]) -> list[tuple[int, int, dict[str, int]]]:
    """Every version some member holds, newest first: ``(version, commits, {key: elements missing})``."""
    versions: dict[int, int] = {}
    for holdings in held:
        for h in holdings:
            versions[h.version] = h.commits
    result = []
    for version in sorted(versions, reverse=True):
        of_version = [next((h for h in holdings if h.version == version), None) for holdings in held]
        tensors: dict[str, TensorInfo] = {}
        for found in of_version:
            if found is not None:
                tensors.update(found.tensors)
        missing = {
            key: gap
            for key, info in tensors.items()
            if (gap := missing_elements(info, distinct_chunks(of_version, version, key)))
        }
        result.append((version, versions[version], missing))
    return result


def plan_shards(held: Sequence[Sequence[Holding]], targets: Sequence[Mapping[str, Box]]) -> ShardPlan:
    """The plan every member derives: ``held[r]`` is what rank ``r`` holds, ``targets[r]`` the chunk of each
    tensor the new layout gives it. Senders are chosen so each piece comes from the target itself where it holds
    it, else from the holder with the fewest elements to send so far (ties: the lowest rank)."""
    newest_missing: dict[str, int] = {}
    for index, (version, commits, missing) in enumerate(whole_versions(held)):
        if index == 0:
            newest_missing = missing
        if missing:
            continue
        of_version = [next((h for h in holdings if h.version == version), None) for holdings in held]
        replicated = next((r for r, h in enumerate(of_version) if h is not None and h.replicated), -1)
        if replicated < 0:
            continue
        return ShardPlan(version, commits, replicated, _pieces(of_version, version, targets), newest_missing)
    return ShardPlan(None, 0, -1, (), newest_missing)


def _pieces(
    of_version: Sequence[Holding | None], version: int, targets: Sequence[Mapping[str, Box]]
) -> tuple[Piece, ...]:
    load = [0] * len(targets)
    pieces: list[Piece] = []
    chunks_by_key: dict[str, dict[Box, list[int]]] = {}
    for target_rank, wanted in enumerate(targets):
        for key in sorted(wanted):
            to_chunk = wanted[key]
            if not volume(to_chunk):
                continue
            chunks = chunks_by_key.get(key)
            if chunks is None:
                chunks = chunks_by_key[key] = distinct_chunks(of_version, version, key)
            for from_chunk in sorted(chunks):
                box = overlap(from_chunk, to_chunk)
                if box is None:
                    continue
                holders = chunks[from_chunk]
                if target_rank in holders:
                    source = target_rank
                else:
                    source = min(holders, key=lambda r: (load[r], r))
                    load[source] += volume(box)
                pieces.append(Piece(key, source, target_rank, box, from_chunk, to_chunk))
    return tuple(pieces)


def arrange_mesh(shape: tuple[int, int], hints: Sequence[tuple[int, tuple[int, int, int]] | None]) -> list[list[int]]:
    """The ranks of a ``(replicas, shard_size)`` mesh, row by row (a row is a replica group).

    A rank's chunks on such a mesh depend only on its column (its shard). Ranks follow the hosts, not the replica
    groups, so a replica group that goes on may find its members at other ranks than before. Each row of the
    previous mesh that is whole here, with the newest version and this shard size, and whose members' new ranks
    are still in the order of their columns, stays one row: every member keeps its shard, and its chunks stay
    where they are. The other ranks fill the remaining rows in rank order.

    Every row is in ascending rank order: FSDP2 takes a rank's shard from its rank in the row's process group,
    which orders members by global rank, while the mesh (and DCP) read it from the column; the two agree only
    when rows ascend. ``hints[r]`` is rank ``r``'s newest copy as ``(version, (shard_size, row, column))``, or
    None (a newcomer, or a copy of a 1-D mesh).
    """
    replicas, shard_size = shape
    newest = max((hint[0] for hint in hints if hint is not None), default=None)
    previous_rows: dict[int, list[tuple[int, int]]] = {}
    for rank, hint in enumerate(hints):
        if hint is not None and hint[0] == newest and hint[1][0] == shard_size:
            previous_rows.setdefault(hint[1][1], []).append((rank, hint[1][2]))
    rows: list[list[int]] = []
    for _, members in sorted(previous_rows.items()):
        if len(rows) < replicas and [column for _, column in sorted(members)] == list(range(shard_size)):
            rows.append(sorted(rank for rank, _ in members))
    taken = {rank for row in rows for rank in row}
    others = [rank for rank in range(len(hints)) if rank not in taken]
    rows += [others[i : i + shard_size] for i in range(0, len(others), shard_size)]
    return sorted(rows)


def ring_shift(nodes: Sequence[str]) -> int:
    """The smallest shift ``s`` for which every rank's buddy ``(rank + s) % size`` is on another node; 1 where
    no shift does that (one node, or nodes of uneven sizes with no such shift)."""
    size = len(nodes)
    for shift in range(1, size):
        if all(nodes[r] != nodes[(r + shift) % size] for r in range(size)):
            return shift
    return 1
