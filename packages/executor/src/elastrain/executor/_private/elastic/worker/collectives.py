"""Broadcasts that elastic state syncs with: objects without numpy, tensors in place and in buckets.

``torch.distributed.broadcast_object_list`` needs numpy (it fails with "Numpy is not available" in a worker
without it) and pickles whatever it is given; state sync sends tensors as tensors, in place, and pickles only
small metadata.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any

# Tensors smaller than this are packed together into one broadcast; larger ones are sent where they lie.
_BUCKET_BYTES = 32 * 2**20


def collective_device() -> Any:
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def side_group() -> Any:
    """A gloo group over the current world for background work (buddy copies, checkpoints). It fails within the
    job's collective timeout, as the world's own group does, not torch's default of 30 minutes: a survivor
    waiting on a lost peer here is freed as soon as one waiting in the world's group."""
    import datetime

    import torch.distributed as dist

    from elastrain.executor._private.elastic.worker import runtime

    options = getattr(runtime.current_or_none(), "options", None)
    seconds = getattr(options, "collective_timeout_s", None)
    timeout = datetime.timedelta(seconds=float(seconds)) if seconds else None
    return dist.new_group(backend="gloo", timeout=timeout)


def broadcast_object(value: Any, source: int) -> Any:
    """``value`` from rank ``source`` on every rank (pickled; keep it small: tensors go through
    :func:`broadcast_tensors`)."""
    import torch
    import torch.distributed as dist

    device = collective_device()
    sending = dist.get_rank() == source
    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL) if sending else b""
    length = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    dist.broadcast(length, source)
    # A bytearray shared with a CPU tensor: received bytes land where pickle reads them, with no copy.
    received = bytearray(payload) if sending else bytearray(int(length.item()))
    if not received:
        return value
    host = torch.frombuffer(received, dtype=torch.uint8)
    wire = host if device.type == "cpu" else host.to(device)
    dist.broadcast(wire, source)
    if sending:
        return value
    if wire is not host:
        host.copy_(wire)
    return pickle.loads(received)  # noqa: S301 - state of this job's own workers


def all_gather_object(value: Any, group: Any = None) -> list[Any]:
    """Every rank's ``value``, in rank order (pickled; two all-gathers: the lengths, then the bytes padded to the
    longest)."""
    import torch
    import torch.distributed as dist

    device = collective_device() if group is None else torch.device("cpu")
    size = dist.get_world_size(group)
    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    length = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    lengths = [torch.zeros_like(length) for _ in range(size)]
    dist.all_gather(lengths, length, group=group)
    longest = max(int(n.item()) for n in lengths)
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    wires = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(size)]
    dist.all_gather(wires, mine.to(device), group=group)
    values = []
    for wire, n in zip(wires, lengths, strict=True):
        received = bytearray(int(n.item()))  # torch without numpy: copy into a buffer pickle reads
        if received:
            torch.frombuffer(received, dtype=torch.uint8).copy_(wire[: len(received)])
        values.append(pickle.loads(received))  # noqa: S301 - state of this job's own workers
    return values


def broadcast_tensors(
    tensors: Sequence[Any],
    source: int,
    *,
    after: Callable[[int], None] | None = None,
    bucket_bytes: int = _BUCKET_BYTES,
) -> None:
    """Overwrite ``tensors`` on every rank with rank ``source``'s, in place.

    Every rank passes tensors of the same shapes and dtypes in the same order. Large contiguous tensors on the
    collective device are broadcast where they lie; the rest are packed by dtype into buckets of at most
    ``bucket_bytes``, so a model of many small layers costs a few collectives, not one per tensor.

    ``after(i)`` runs once ``tensors[i]`` holds the source's values, while the next broadcast is already in
    flight: state sync copies each tensor into the committed copy there, overlapping that copy with the
    transfer instead of adding it afterwards.
    """
    import torch.distributed as dist

    device = collective_device()
    receiving = dist.get_rank() != source
    units: list[list[int]] = []  # indices of tensors that travel together, in order
    open_buckets: dict[Any, list[int]] = {}
    for index, tensor in enumerate(tensors):
        if tensor.numel() == 0:
            continue
        if tensor.device == device and tensor.is_contiguous() and tensor.nbytes >= bucket_bytes // 4:
            units.append([index])
            continue
        bucket = open_buckets.setdefault(tensor.dtype, [])
        if bucket and sum(tensors[i].nbytes for i in bucket) + tensor.nbytes > bucket_bytes:
            units.append(list(bucket))
            bucket.clear()
        bucket.append(index)
    units.extend(bucket for bucket in open_buckets.values() if bucket)

    in_flight: list[tuple[Any, Callable[[], None], list[int]]] = []
    for unit in units:
        in_flight.append((*_start(tensors, unit, source, device, receiving), unit))
        if len(in_flight) > 1:  # keep one broadcast going while the previous one is finished off
            _finish(*in_flight.pop(0), after)
    while in_flight:
        _finish(*in_flight.pop(0), after)
    if after is not None:
        for index, tensor in enumerate(tensors):
            if tensor.numel() == 0:
                after(index)


def _finish(work: Any, unpack: Callable[[], None], unit: list[int], after: Callable[[int], None] | None) -> None:
    work.wait()
    unpack()
    if after is not None:
        for index in unit:
            after(index)


def _start(
    tensors: Sequence[Any], unit: list[int], source: int, device: Any, receiving: bool
) -> tuple[Any, Callable[[], None]]:
    """Start broadcasting one unit; returns its work and what completes it (unpacking, then ``after``)."""
    import torch
    import torch.distributed as dist

    if len(unit) == 1 and tensors[unit[0]].device == device and tensors[unit[0]].is_contiguous():
        return dist.broadcast(tensors[unit[0]], source, async_op=True), lambda: None
    parts = [tensors[i] for i in unit]
    if receiving:
        flat = torch.empty(sum(t.numel() for t in parts), dtype=parts[0].dtype, device=device)
    else:
        flat = torch.cat([t.detach().reshape(-1).to(device) for t in parts])

    def unpack() -> None:
        if not receiving:
            return
        offset = 0
        with torch.no_grad():
            for tensor in parts:
                count = tensor.numel()
                tensor.copy_(flat[offset : offset + count].view_as(tensor))
                offset += count

    return dist.broadcast(flat, source, async_op=True), unpack
