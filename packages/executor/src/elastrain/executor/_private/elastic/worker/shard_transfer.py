"""Moving a :class:`ShardPlan`'s pieces: local copies, then one message each way between every pair of members.

Every member runs this with the same plan. What one rank sends another is packed, in plan order, into a single
byte buffer and sent point to point on the world's group; the receiver, which computed the same order, unpacks
it into its targets. No member sends a byte that its receiver does not need.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from elastrain.executor._private.elastic.worker.shard_copies import sub_box
from elastrain.executor._private.elastic.worker.shard_plan import Box, Piece, ShardPlan


@dataclass(frozen=True)
class Moved:
    """What one member's part of a transfer amounted to."""

    local_bytes: int
    sent_bytes: int
    received_bytes: int


def move_pieces(
    plan: ShardPlan,
    rank: int,
    source_chunk: Callable[[str, Box], Any],
    targets: Mapping[str, Any],
    *,
    piece_done: Callable[[], None] = lambda: None,
) -> Moved:
    """Fill this rank's ``targets`` (key → its chunk, on any device) from the plan's pieces.

    ``source_chunk(key, box)`` returns the CPU tensor of a chunk of the plan's version held here.
    """
    import torch
    import torch.distributed as dist

    from elastrain.executor._private.elastic.worker.collectives import collective_device

    device = collective_device()  # NCCL moves device memory only
    local_bytes = sent_bytes = received_bytes = 0
    works: list[Any] = []
    incoming: list[tuple[list[Piece], Any]] = []
    peers = sorted(
        {p.target for p in plan.pieces if p.source == rank} | {p.source for p in plan.pieces if p.target == rank}
    )
    for peer in peers:
        if peer == rank:
            continue
        outgoing = plan.pieces_between(rank, peer)
        if outgoing:
            parts = [_bytes_of(sub_box(source_chunk(p.key, p.from_chunk), p.from_chunk, p.box)) for p in outgoing]
            packed = torch.cat(parts).to(device)
            works.append(dist.isend(packed, peer))
            sent_bytes += packed.numel()
        arriving = plan.pieces_between(peer, rank)
        if arriving:
            size = sum(p.numel * targets[p.key].element_size() for p in arriving)
            buffer = torch.empty(size, dtype=torch.uint8, device=device)
            works.append(dist.irecv(buffer, peer))
            incoming.append((arriving, buffer))
            received_bytes += size
    with torch.no_grad():
        for piece in plan.pieces_between(rank, rank):  # overlapped with the messages in flight
            part = sub_box(source_chunk(piece.key, piece.from_chunk), piece.from_chunk, piece.box)
            sub_box(targets[piece.key], piece.to_chunk, piece.box).copy_(part)
            local_bytes += part.numel() * part.element_size()
            piece_done()
        for work in works:
            work.wait()
        for arriving, buffer in incoming:
            start = 0
            for piece in arriving:
                target = targets[piece.key]
                nbytes = piece.numel * target.element_size()
                raw = buffer[start : start + nbytes].view(target.dtype).view(piece.box[1])
                sub_box(target, piece.to_chunk, piece.box).copy_(raw)
                start += nbytes
                piece_done()
    return Moved(local_bytes, sent_bytes, received_bytes)


def _bytes_of(tensor: Any) -> Any:
    """A tensor's elements as a flat uint8 CPU tensor."""
    return tensor.detach().cpu().contiguous().reshape(-1).view(_uint8())


def _uint8() -> Any:
    import torch

    return torch.uint8
