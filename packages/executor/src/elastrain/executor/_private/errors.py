"""What the executor raises when workers fail, placement cannot be met, or the executor is misused."""

from __future__ import annotations

from typing import Any

from elastrain.executor._private.tracebacks import clean_traceback


class ExecutorError(RuntimeError):
    """Base class of the executor's own errors."""


class ElasticJobError(ExecutorError):
    """An elastic job could not go on: too few workers for too long, too many resets, or a worker raised."""

    __module__ = "elastrain.executor.elastic"  # its public name in tracebacks and reprs


class WorkerError(ExecutorError):
    """A worker's function raised. ``rank`` names the worker; ``remote_traceback`` is the worker's traceback (plain
    text), ``cause`` the exception it raised (None when the driver could not unpickle it), ``pid`` its process.

    The message holds the traceback once. ``cause`` is deliberately not the ``__cause__``: Python would print
    it above the traceback, and its text (it has no frames on the driver) would show twice.
    """

    def __init__(
        self,
        rank: int,
        node_id: str | None,
        remote_traceback: str,
        cause: BaseException | None,
        pid: int | None = None,
    ) -> None:
        self.rank = rank
        self.node_id = node_id
        self.remote_traceback = remote_traceback
        self.cause = cause
        self.pid = pid
        where = f"node {node_id}" + (f", pid {pid}" if pid is not None else "")
        super().__init__(f"Rank {rank} worker raised an error ({where}):\n{remote_traceback}")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.rank, self.node_id, self.remote_traceback, self.cause, self.pid), self.__dict__


class WorkerDiedError(ExecutorError):
    """A worker's actor died (killed, out of memory, its node lost) while it ran a function."""

    def __init__(self, rank: int, node_id: str | None, reason: str) -> None:
        self.rank = rank
        self.node_id = node_id
        self.reason = reason
        super().__init__(f"Rank {rank} worker on node {node_id} died: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.rank, self.node_id, self.reason), self.__dict__


class PlacementError(ExecutorError, TimeoutError):
    """The cluster cannot grant the workers' resources: never (raised at once), or not within
    ``placement_group_timeout_s``.

    It is also a ``TimeoutError``, as every placement failure of Horovod's ``RayExecutor`` is, so code written
    for Horovod (``except TimeoutError``) keeps working.
    """


class ExecutorNotStartedError(ExecutorError):
    """A method that needs workers was called before ``start()`` or after ``shutdown()``."""


class VersionMismatchError(ExecutorError):
    """A worker runs other elastrain versions than the driver; the message names both and what to change."""


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:500] if text else type(error).__name__


def worker_actor_died(error: BaseException) -> bool:
    """Whether a failed call means the worker's own actor died, not that its function raised.

    A task that raised because some other actor it called had died is both a ``RayTaskError`` and a
    ``RayActorError``: its worker lived, and the caller needs the worker's traceback.
    """
    import ray

    return isinstance(error, ray.exceptions.RayActorError) and not isinstance(error, ray.exceptions.RayTaskError)


def unserializable_types() -> tuple[type[Exception], ...]:
    """Ray's error for a worker's exception that the driver could not unpickle (``UnserializableException``); Ray
    before 2.41 has none and raises ``RayTaskError`` for it."""
    import ray

    found = getattr(ray.exceptions, "UnserializableException", None)
    return (found,) if found is not None else ()


def worker_error(rank: int, node_id: str | None, error: BaseException) -> WorkerError:
    """The :class:`WorkerError` for a call that raised on the worker of ``rank`` (Ray's ``RayTaskError``, or its
    ``UnserializableException`` when the worker's exception could not be unpickled here)."""

    text = str(error)
    unpicklable = isinstance(error, unserializable_types())
    if unpicklable:
        # Ray's text: an explanation, then "Original exception:" and the worker's formatted error.
        text = text.split("Original exception:\n", 1)[-1].removeprefix("ray.exceptions.RayTaskError: ")
    remote = clean_traceback(text)
    cause = None if unpicklable else getattr(error, "cause", None)
    failure = WorkerError(rank, node_id, remote.text, cause if isinstance(cause, BaseException) else None, remote.pid)
    if unpicklable:
        failure.add_note(
            "The driver could not unpickle the worker's exception, so `cause` is None; give its class a "
            "`__reduce__` that rebuilds it from its arguments."
        )
    return failure


# Tracebacks and reprs name a class by its __module__: the public module, not where it is implemented.
for _public in (
    ExecutorError,
    WorkerError,
    WorkerDiedError,
    PlacementError,
    ExecutorNotStartedError,
    VersionMismatchError,
):
    _public.__module__ = "elastrain.executor"
