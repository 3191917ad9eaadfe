"""What the executor raises when workers fail, placement cannot be met, or the executor is misused."""

from __future__ import annotations


class ExecutorError(RuntimeError):
    """Base class of the executor's own errors."""


class WorkerError(ExecutorError):
    """A worker's function raised. ``rank`` names the worker; ``remote_traceback`` is the worker's traceback."""

    def __init__(self, rank: int, node_id: str | None, remote_traceback: str, cause: BaseException | None) -> None:
        self.rank = rank
        self.node_id = node_id
        self.remote_traceback = remote_traceback
        self.cause = cause
        super().__init__(f"Rank {rank} worker raised an error (node {node_id}):\n{remote_traceback}")


class WorkerDiedError(ExecutorError):
    """A worker's actor died (killed, out of memory, its node lost) while it ran a function."""

    def __init__(self, rank: int, node_id: str | None, reason: str) -> None:
        self.rank = rank
        self.node_id = node_id
        self.reason = reason
        super().__init__(f"Rank {rank} worker on node {node_id} died: {reason}")


class PlacementError(ExecutorError, TimeoutError):
    """The cluster cannot grant the workers' resources: never (raised at once), or not within
    ``placement_group_timeout_s``.

    It is also a ``TimeoutError``, as every placement failure of Horovod's ``RayExecutor`` is, so code written
    for Horovod (``except TimeoutError``) keeps working.
    """


class ExecutorNotStartedError(ExecutorError):
    """A method that needs workers was called before ``start()`` or after ``shutdown()``."""


def worker_actor_died(error: BaseException) -> bool:
    """Whether a failed call means the worker's own actor died, not that its function raised.

    A task that raised because some other actor it called had died is both a ``RayTaskError`` and a
    ``RayActorError``: its worker lived, and the caller needs the worker's traceback.
    """
    import ray

    return isinstance(error, ray.exceptions.RayActorError) and not isinstance(error, ray.exceptions.RayTaskError)
