"""The worker side of an elastic job: the retry loop of ``elastic.run`` and the calls state makes.

Group forming lives in ``group.py``; this module rolls back, rejoins and resyncs around the user's function.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from elastrain.executor._private.elastic.options import ElasticOptions
from elastrain.executor._private.elastic.worker.faults import fault_point
from elastrain.executor._private.elastic.worker.group import (
    InternalError,
    Runtime,
    WorkerRemoved,
    is_collective_failure,
)
from elastrain.executor._private.errors import first_line

if TYPE_CHECKING:
    from elastrain.executor._private.elastic.worker.state import State

T = TypeVar("T")
logger = logging.getLogger("elastrain.executor")


class HostsUpdatedInterrupt(Exception):
    """Raised on every worker at a commit when the driver has a new world for them (hosts added or removed).

    Nothing is rolled back. ``skip_sync`` is True when the new world only lost members: every member then holds
    the same state already, and only what depends on the world (a sampler's split) is synced.
    """

    __module__ = "elastrain.executor.elastic"  # its public name in tracebacks and reprs

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__(f"hosts updated (skip_sync={skip_sync})")
        self.skip_sync = skip_sync

    def __reduce__(self) -> tuple[type[HostsUpdatedInterrupt], tuple[bool]]:
        return (type(self), (self.skip_sync,))  # the default would pass the message back as skip_sync


_current: Runtime | None = None


def install(runtime: Runtime | None) -> None:
    global _current
    _current = runtime


def current() -> Runtime:
    if _current is None:
        raise RuntimeError(
            "elastic.run and elastic state only work inside an elastic RayExecutor job "
            "(RayExecutor(settings, min_workers=...))."
        )
    return _current


def current_or_none() -> Runtime | None:
    return _current


def check_host_updates() -> None:
    update = current().pending_update()
    if update:
        raise HostsUpdatedInterrupt(skip_sync=update == 1)


def held_commits(commits: int) -> None:
    """The state now holds ``commits`` commits (``Runtime.hold``: the job's first at once, the rest with the next
    beat or arrival)."""
    if _current is not None:
        _current.hold(commits)


def rank() -> int:
    """This worker's rank in its current group; -1 before it joined one."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else -1


def run(func: Callable[..., T]) -> Callable[..., T]:
    """Make ``func(state, *args, **kwargs)`` elastic: it survives peers failing and hosts coming and going.

    On a collective failure (or :class:`InternalError`) the state rolls back to its last commit; on a host update
    it keeps its work. Either way the worker joins the next group, the reset callbacks run, the state is synced
    across the new world, and ``func`` is called again. When no member of the new world holds the committed
    state any more (its last holders died), the latest persisted copy is loaded; without one the job fails with
    ``ElasticJobError``, unless ``start_over_on_state_loss=True`` lets it start over from the initial state.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> T:
        runtime = current()
        rejoin = runtime.world is None
        skip_sync = False
        while True:
            try:
                if rejoin:
                    runtime.role = state._pre_sync_role()
                    runtime.join_next_world()
                    rejoin = False
                # The reset callbacks run in there, on every member, newcomers too; the sync evens out the rest.
                state._synchronize(skip_sync=skip_sync)
                value = func(state, *args, **kwargs)
                fault_point("finish")
                _flush_persistence(state)
                return value
            except HostsUpdatedInterrupt as interrupt:
                state._interrupted(interrupt)
                skip_sync = interrupt.skip_sync
                if not runtime.update_published():
                    # Raised by the training code itself: ask the driver for a new group of the same workers.
                    runtime.report_failure(interrupt)
            except Exception as error:
                if not is_collective_failure(error):
                    # The job fails: what was committed before the error still reaches the store, so that a
                    # restarted job resumes from it.
                    _flush_persistence(state)
                    raise
                runtime.report_failure(error)
                state._roll_back()
                skip_sync = False
            runtime.resets += 1
            rejoin = True

    return wrapper


def _flush_persistence(state: State) -> None:
    """Rank 0 waits for the persisted state's upload in flight (bounded by the store's own deadlines); a failure
    there no longer fails the job."""
    flush_all_ranks = getattr(state, "_flush_all_ranks", None)
    if callable(flush_all_ranks):  # a sharded state: every rank writes its part
        try:
            flush_all_ranks()
        except Exception as error:
            logger.warning("Persisting the final state failed: %s", first_line(error))
        return
    persistence = getattr(getattr(state, "_book", None), "persistence", None)
    if persistence is None or (rank() != 0 and not getattr(persistence, "every_rank", False)):
        return
    try:
        persistence.flush()
    except Exception as error:
        logger.warning("Persisting the final state failed: %s", first_line(error))


__all__ = [
    "ElasticOptions",
    "HostsUpdatedInterrupt",
    "InternalError",
    "Runtime",
    "WorkerRemoved",
    "is_collective_failure",
]
