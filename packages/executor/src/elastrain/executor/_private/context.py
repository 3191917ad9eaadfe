"""What a worker knows about itself while it runs a function: ``elastrain.executor.context()`` and ``send()``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class WorkerContext:
    """The placement of the calling worker.

    ``rank``/``size``: among all workers. ``local_rank``/``local_size``: among the workers on its host.
    ``cross_rank``/``cross_size``: among the hosts that have a worker with its local rank (Horovod's meaning).
    ``node_rank``/``num_nodes``: its host's index among the hosts in use (torchrun's ``GROUP_RANK``).
    ``gpu_ids``: the GPUs Ray gave this worker; ``visible_gpu_ids``: what ``CUDA_VISIBLE_DEVICES`` lists (every
    GPU of the workers on its host), so ``device_index`` is this worker's own GPU in torch's numbering.
    """

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    node_rank: int
    num_nodes: int
    node_id: str
    node_ip: str
    hostname: str
    pid: int
    gpu_ids: tuple[str, ...] = ()
    visible_gpu_ids: tuple[str, ...] = ()
    backend: str = "torch"
    run_id: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def device_index(self) -> int | None:
        """This worker's GPU as torch numbers it (``cuda:<index>``), or ``None`` without a GPU."""
        if not self.gpu_ids:
            return None
        return self.visible_gpu_ids.index(self.gpu_ids[0])


class _WorkerState:
    """The per-process state a worker actor installs before it runs user code."""

    context: WorkerContext | None = None
    sender: Callable[[dict[str, Any]], None] | None = None  # forwards send() to the executor's message sink


def context() -> WorkerContext:
    """The calling worker's :class:`WorkerContext`. Only available inside a RayExecutor worker."""
    if _WorkerState.context is None:
        raise RuntimeError(
            "elastrain.executor.context() is only available inside a function that a RayExecutor runs on its "
            "workers (run, execute, execute_single)."
        )
    return _WorkerState.context


def send(message: Mapping[str, Any]) -> None:
    """Send ``message`` (a dict, e.g. per-step metrics) to the driver's ``callbacks`` of the running call.

    Returns at once; messages from one worker arrive in the order sent, while the job runs. Outside a worker,
    or when the call has no callbacks, messages are dropped.
    """
    if not isinstance(message, Mapping):
        raise TypeError(f"send() takes a dict of values, got {type(message).__name__}.")
    if _WorkerState.sender is not None:
        _WorkerState.sender(dict(message))
