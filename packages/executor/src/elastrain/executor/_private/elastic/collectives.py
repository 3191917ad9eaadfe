"""Broadcasts that elastic state syncs with: objects without numpy, tensors in place and in buckets.

``torch.distributed.broadcast_object_list`` needs numpy (it fails with "Numpy is not available" in a worker
without it) and pickles whatever it is given; state sync sends tensors as tensors, in place, and pickles only
small metadata.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

# Tensors smaller than this are packed together into one broadcast; larger ones are sent where they lie.
_BUCKET_BYTES = 32 * 2**20


def collective_device() -> Any:
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


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


def broadcast_tensors(tensors: Sequence[Any], source: int, bucket_bytes: int = _BUCKET_BYTES) -> None:
    """Overwrite ``tensors`` on every rank with rank ``source``'s, in place.

    Every rank passes tensors of the same shapes and dtypes in the same order. Large contiguous tensors on the
    collective device are broadcast where they lie; the rest are packed by dtype into buckets of at most
    ``bucket_bytes``, so a model of many small layers costs a few collectives, not one per tensor.
    """
    import torch.distributed as dist

    device = collective_device()
    receiving = dist.get_rank() != source
    buckets: dict[Any, list[Any]] = {}
    for tensor in tensors:
        if tensor.numel() == 0:
            continue
        if tensor.device == device and tensor.is_contiguous() and tensor.nbytes >= bucket_bytes // 4:
            dist.broadcast(tensor, source)
            continue
        bucket = buckets.setdefault(tensor.dtype, [])
        if bucket and sum(t.nbytes for t in bucket) + tensor.nbytes > bucket_bytes:
            _broadcast_packed(bucket, source, device, receiving)
            bucket.clear()
        bucket.append(tensor)
    for bucket in buckets.values():
        if bucket:
            _broadcast_packed(bucket, source, device, receiving)


def _broadcast_packed(tensors: list[Any], source: int, device: Any, receiving: bool) -> None:
    import torch
    import torch.distributed as dist

    if receiving:
        flat = torch.empty(sum(t.numel() for t in tensors), dtype=tensors[0].dtype, device=device)
    else:
        flat = torch.cat([t.detach().reshape(-1).to(device) for t in tensors])
    dist.broadcast(flat, source)
    if receiving:
        offset = 0
        with torch.no_grad():
            for tensor in tensors:
                count = tensor.numel()
                tensor.copy_(flat[offset : offset + count].view_as(tensor))
                offset += count
