"""The interface between the executor and a collective backend, and the registry of backends by name."""

from __future__ import annotations

import abc
import importlib
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from elastrain.executor._private.placement import WorkerPlacement
from elastrain.executor._private.settings import ExecutorSettings


class WorkerGroup(abc.ABC):
    """What a backend may ask of the started workers."""

    @abc.abstractmethod
    def call(self, rank: int, fn: Callable[[], Any]) -> Any:
        """Run ``fn()`` in the worker with this rank and return its result (bounded by ``timeout_s``)."""


class Backend(abc.ABC):
    """Prepares workers for one collective library.

    The executor calls :meth:`worker_env` once the workers' ranks are known and sets the returned variables in
    each worker before any user code runs; :meth:`shutdown` when the executor shuts down. A new backend
    subclasses this and is passed to ``RayExecutor(backend=MyBackend())``, or registered by name with
    :func:`register_backend`.
    """

    name: ClassVar[str]

    @abc.abstractmethod
    def worker_env(
        self, placements: Sequence[WorkerPlacement], group: WorkerGroup, settings: ExecutorSettings, run_id: str
    ) -> list[dict[str, str]]:
        """Environment variables for each worker, indexed by rank."""

    def shutdown(self) -> None:  # noqa: B027 - most backends hold nothing on the driver
        """Release driver-side resources (servers, threads)."""


_BACKENDS: dict[str, str] = {
    "torch": "elastrain.executor._private.backends.torch_backend:TorchBackend",
    "horovod": "elastrain.executor._private.backends.horovod_backend:HorovodBackend",
}


def register_backend(name: str, factory: str | Callable[[], Backend]) -> None:
    """Make ``RayExecutor(backend=name)`` build a backend with ``factory`` ("module:Class" or a callable)."""
    _BACKENDS[name] = factory  # type: ignore[assignment]


def resolve_backend(backend: str | Backend) -> Backend:
    if isinstance(backend, Backend):
        return backend
    if not isinstance(backend, str) or backend not in _BACKENDS:
        raise ValueError(f"Unknown backend {backend!r}; use one of {sorted(_BACKENDS)} or a Backend instance.")
    factory: Any = _BACKENDS[backend]
    if isinstance(factory, str):
        module_name, _, class_name = factory.partition(":")
        factory = getattr(importlib.import_module(module_name), class_name)
    made = factory()
    if not isinstance(made, Backend):
        raise TypeError(f"The factory of backend {backend!r} returned {type(made).__name__}, not a Backend.")
    return made
