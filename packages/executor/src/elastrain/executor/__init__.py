"""Run distributed PyTorch functions on a group of Ray actors, with Horovod's ``RayExecutor`` API.

Driver side: :class:`RayExecutor`. Worker side: :func:`context`, :func:`send` and :func:`init_process_group`.
Importing this package imports neither Ray nor torch nor horovod.
"""

from elastrain.executor._private.backends.base import Backend, WorkerGroup, register_backend
from elastrain.executor._private.context import WorkerContext, context, send
from elastrain.executor._private.errors import (
    ExecutorError,
    ExecutorNotStartedError,
    PlacementError,
    WorkerDiedError,
    WorkerError,
)
from elastrain.executor._private.executor import RayExecutor
from elastrain.executor._private.placement import NodeInfo, WorkerPlacement
from elastrain.executor._private.settings import ExecutorSettings
from elastrain.executor._private.torch_group import init_process_group
from elastrain.executor._version import __version__

__all__ = [
    # driver side
    "RayExecutor",
    "ExecutorSettings",
    # worker side
    "context",
    "WorkerContext",
    "send",
    "init_process_group",
    # errors
    "ExecutorError",
    "WorkerError",
    "WorkerDiedError",
    "PlacementError",
    "ExecutorNotStartedError",
    # backends
    "Backend",
    "WorkerGroup",
    "WorkerPlacement",
    "NodeInfo",
    "register_backend",
    "__version__",
]
