"""Run distributed PyTorch functions on a group of Ray actors, with Horovod's ``RayExecutor`` API.

Driver side: :class:`RayExecutor`. Worker side: :func:`context`, :func:`send` and :func:`init_process_group`.
Importing this package imports neither Ray nor torch nor horovod.
"""

import importlib
from typing import TYPE_CHECKING, Any

from elastrain.executor._version import __version__

if TYPE_CHECKING:
    from elastrain.executor._private.backends.base import Backend, WorkerGroup, register_backend
    from elastrain.executor._private.capacity import check_can_place
    from elastrain.executor._private.context import WorkerContext, context, send
    from elastrain.executor._private.errors import (
        ExecutorError,
        ExecutorNotStartedError,
        PlacementError,
        VersionMismatchError,
        WorkerDiedError,
        WorkerError,
    )
    from elastrain.executor._private.executor import RayExecutor
    from elastrain.executor._private.node import NodeInfo
    from elastrain.executor._private.placement import WorkerPlacement
    from elastrain.executor._private.raylet_watch import watch_raylet
    from elastrain.executor._private.settings import ExecutorSettings
    from elastrain.executor._private.torch_group import init_process_group

# Names load on first use (PEP 562): a worker process that only needs the worker actor does not import the
# driver side (executor, elastic driver, discovery), which shortens every worker's start.
_LAZY = {
    "Backend": "elastrain.executor._private.backends.base",
    "WorkerGroup": "elastrain.executor._private.backends.base",
    "register_backend": "elastrain.executor._private.backends.base",
    "check_can_place": "elastrain.executor._private.capacity",
    "WorkerContext": "elastrain.executor._private.context",
    "context": "elastrain.executor._private.context",
    "send": "elastrain.executor._private.context",
    "ExecutorError": "elastrain.executor._private.errors",
    "ExecutorNotStartedError": "elastrain.executor._private.errors",
    "PlacementError": "elastrain.executor._private.errors",
    "VersionMismatchError": "elastrain.executor._private.errors",
    "WorkerDiedError": "elastrain.executor._private.errors",
    "WorkerError": "elastrain.executor._private.errors",
    "RayExecutor": "elastrain.executor._private.executor",
    "NodeInfo": "elastrain.executor._private.node",
    "WorkerPlacement": "elastrain.executor._private.placement",
    "watch_raylet": "elastrain.executor._private.raylet_watch",
    "ExecutorSettings": "elastrain.executor._private.settings",
    "init_process_group": "elastrain.executor._private.torch_group",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'elastrain.executor' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    # driver side
    "RayExecutor",
    "ExecutorSettings",
    # worker side
    "context",
    "WorkerContext",
    "send",
    "init_process_group",
    "watch_raylet",
    # errors
    "ExecutorError",
    "WorkerError",
    "WorkerDiedError",
    "PlacementError",
    "ExecutorNotStartedError",
    "VersionMismatchError",
    # backends
    "Backend",
    "WorkerGroup",
    "WorkerPlacement",
    "NodeInfo",
    "register_backend",
    "check_can_place",
    "__version__",
]
