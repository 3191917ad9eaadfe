"""Committed copies of a sharded state in CPU memory: one flat byte buffer per saved version.

A rank's chunks of every sharded tensor of one version lie in a single buffer, each at an aligned offset, so a
whole copy goes to its buddy as one message and a later save reuses the buffer of a copy no longer needed.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from elastrain.executor._private.elastic.worker.memory import empty_cpu
from elastrain.executor._private.elastic.worker.shard_plan import Box, Holding, TensorInfo

_ALIGN = 64


@dataclass(frozen=True)
class Slot:
    """Where one tensor's chunk lies in a copy's buffer."""

    box: Box
    info: TensorInfo
    start: int  # byte offset in the buffer
    nbytes: int


class Layout:
    """Which chunk of each tensor one rank holds in one world, and where each lies in a copy's buffer."""

    def __init__(self, chunks: Mapping[str, tuple[Box, TensorInfo]]) -> None:
        import torch

        self.slots: dict[str, Slot] = {}
        start = 0
        for key, (box, info) in chunks.items():
            size = 1
            for extent in box[1]:
                size *= extent
            nbytes = size * getattr(torch, info.dtype).itemsize
            self.slots[key] = Slot(box, info, start, nbytes)
            start += -(-nbytes // _ALIGN) * _ALIGN
        self.nbytes = start

    def describe(self) -> dict[str, tuple[Box, TensorInfo]]:
        """What another rank needs to know to read a buffer of this layout (picklable)."""
        return {key: (slot.box, slot.info) for key, slot in self.slots.items()}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and self.describe() == other.describe()

    def __hash__(self) -> int:
        return hash(tuple(self.slots))

    def views(self, buffer: Any) -> dict[str, Any]:
        """Each tensor's chunk as a typed tensor over ``buffer``."""
        import torch

        found = {}
        for key, slot in self.slots.items():
            raw = buffer[slot.start : slot.start + slot.nbytes]
            found[key] = raw.view(getattr(torch, slot.info.dtype)).view(slot.box[1])
        return found

    def allocate(self) -> Any:
        import torch

        return empty_cpu((max(self.nbytes, 1),), torch.uint8)


@dataclass
class Copy:
    """One version of the sharded state as one rank held it: its own chunks (with the replicated part) or a
    ward's (``replicated`` None)."""

    version: int
    commits: int
    layout: Layout
    buffer: Any
    replicated: dict[str, Any] | None = None
    place: tuple[int, int, int] | None = None  # (shard size, row, column) on the HSDP mesh it was saved on
    _views: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def views(self) -> dict[str, Any]:
        if self._views is None:
            self._views = self.layout.views(self.buffer)
        return self._views

    def holding(self) -> Holding:
        slots = self.layout.slots
        return Holding(
            self.version,
            self.commits,
            {key: (slot.box,) for key, slot in slots.items()},
            {key: slot.info for key, slot in slots.items()},
            self.replicated is not None,
        )


def merged_holdings(copies: list[Copy]) -> list[Holding]:
    """One :class:`Holding` per version over a rank's copies (its own and its ward's of the same version)."""
    by_version: dict[int, list[Copy]] = {}
    for held in copies:
        by_version.setdefault(held.version, []).append(held)
    holdings = []
    for version, group in sorted(by_version.items()):
        chunks: dict[str, tuple[Box, ...]] = {}
        tensors: dict[str, TensorInfo] = {}
        for held in group:
            for key, slot in held.layout.slots.items():
                if slot.box not in chunks.get(key, ()):
                    chunks[key] = (*chunks.get(key, ()), slot.box)
                tensors[key] = slot.info
        replicated = any(held.replicated is not None for held in group)
        holdings.append(Holding(version, group[0].commits, chunks, tensors, replicated))
    return holdings


def chunk_tensor(copies: list[Copy], version: int, key: str, box: Box) -> Any:
    """The CPU tensor of chunk ``box`` of ``key`` at ``version`` among ``copies``."""
    for held in copies:
        slot = held.layout.slots.get(key)
        if held.version == version and slot is not None and slot.box == box:
            return held.views[key]
    raise KeyError(f"No copy of {key} {box} at version {version} here.")


def sub_box(tensor: Any, chunk: Box, box: Box) -> Any:
    """The part ``box`` (global coordinates) of ``tensor``, which holds ``chunk``."""
    index = tuple(slice(b - c, b - c + n) for b, c, n in zip(box[0], chunk[0], box[1], strict=True))
    return tensor[index]


def iter_copies(*groups: list[Copy] | Copy | None) -> Iterator[Copy]:
    for group in groups:
        if group is None:
            continue
        if isinstance(group, Copy):
            yield group
        else:
            yield from group
