"""Fresh CPU buffers for state copies, backed by huge pages where Linux allows it.

A newcomer's sync allocates a model's worth of memory twice (its optimizer state and its committed copy), and
faulting that in 4 KiB at a time costs more than receiving it. With transparent huge pages in ``madvise`` mode
(the usual default), asking for them on a buffer before it is first touched makes each fault map 2 MiB. Only the
buffers made here are advised: the rest of the process keeps the kernel's default.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import sys
from typing import Any

_MADV_HUGEPAGE = 14  # linux/mman.h
_HUGE_PAGE = 2 << 20
# Smaller buffers come from the allocator's heap (often already touched) and gain nothing.
_ADVISE_FROM_BYTES = 4 * _HUGE_PAGE


@functools.cache
def _madvise() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


def advise_huge_pages(tensor: Any) -> None:
    """Ask for huge pages under a CPU tensor's memory not touched yet; a no-op where that is not possible."""
    madvise = _madvise()
    if madvise is None or tensor.device.type != "cpu" or tensor.nbytes < _ADVISE_FROM_BYTES:
        return
    page = mmap.PAGESIZE
    start = tensor.data_ptr()
    first = -(-start // page) * page
    last = (start + tensor.nbytes) // page * page
    if last > first:
        madvise(first, last - first, _MADV_HUGEPAGE)  # EINVAL where THP is off: the buffer stays as it was


def empty_cpu(shape: Any, dtype: Any) -> Any:
    """An uninitialised CPU tensor whose pages fault in as huge pages where the kernel allows."""
    import torch

    buffer = torch.empty(shape, dtype=dtype)
    advise_huge_pages(buffer)
    return buffer


def cpu_copy(tensor: Any) -> Any:
    """``tensor.detach().to("cpu", copy=True)``, strides and all; a dense buffer of 8 MiB or more is advised for
    huge pages before the copy first touches it (sparse and quantized tensors are copied as they always were)."""
    import torch

    source = tensor.detach()
    if (
        source.layout is not torch.strided
        or source.is_quantized
        or source.nbytes < _ADVISE_FROM_BYTES
        or _madvise() is None
    ):
        return source.to("cpu", copy=True)
    copy = torch.empty_like(source, device="cpu")
    advise_huge_pages(copy)
    copy.copy_(source)
    return copy
