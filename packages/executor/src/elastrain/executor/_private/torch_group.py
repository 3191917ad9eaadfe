"""``init_process_group()``: form the torch.distributed group from the environment the executor set."""

from __future__ import annotations

import datetime
from typing import Any

from elastrain.executor._private.context import context


def _import_torch_distributed() -> tuple[Any, Any]:
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise ImportError(
            "init_process_group() needs PyTorch on the workers: pip install 'elastrain-executor[torch]' "
            "(or the torch build for your hardware)."
        ) from None
    return torch, dist


def init_process_group(backend: str | None = None, *, timeout_s: float | None = None) -> str:
    """Initialise ``torch.distributed`` in the calling worker; returns the backend used.

    ``backend=None`` picks ``nccl`` when this worker has a GPU that torch can use and ``gloo`` otherwise;
    with nccl the worker's own GPU becomes the current device. Calling it again in a worker whose group is
    already up does nothing. ``timeout_s`` bounds every collective (torch's default when ``None``).

    In an elastic job it joins the job's current group (the counterpart of ``hvd.init()``): rank, size and the
    process group are then available before ``@elastic.run``, which re-forms the group at every reset. There
    ``backend`` and ``timeout_s`` are the job's (``create_settings(collective_timeout_s=...)``).
    """
    torch, dist = _import_torch_distributed()
    from elastrain.executor._private.elastic.worker import runtime

    elastic_job = runtime.current_or_none()
    if elastic_job is not None:
        elastic_job.ensure_joined()
        return str(dist.get_backend())
    worker = context()
    if dist.is_initialized():
        return str(dist.get_backend())
    if backend is None:
        backend = "nccl" if worker.gpu_ids and torch.cuda.is_available() else "gloo"
    if backend == "nccl" and worker.device_index is not None:
        torch.cuda.set_device(worker.device_index)
    kwargs = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
    dist.init_process_group(backend, init_method="env://", rank=worker.rank, world_size=worker.size, **kwargs)
    return backend
