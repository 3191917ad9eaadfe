"""Calls on the started workers: wait for all results, and fail fast, naming the rank, when one fails."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from elastrain.executor._private.backends.base import WorkerGroup
from elastrain.executor._private.errors import WorkerDiedError, unserializable_types, worker_actor_died, worker_error
from elastrain.executor._private.placement import WorkerPlacement, wait_ready
from elastrain.executor._private.tracebacks import strip_ansi

logger = logging.getLogger("elastrain.executor")

# How often a wait checks whether some worker failed while others still run.
_POLL_S = 0.05
# After one worker fails, how long the others get to finish before the group is declared broken; workers
# blocked in a collective with the failed one would otherwise wait for their process group's timeout.
_FAILURE_GRACE_S = 2.0


class WorkerCalls(WorkerGroup):
    """The started workers, by rank."""

    def __init__(
        self,
        actors: Sequence[Any],
        placements: Sequence[WorkerPlacement],
        timeout_s: float,
        on_broken: Callable[[], None],
    ) -> None:
        self.actors = list(actors)
        self._placements = list(placements)
        self._timeout_s = timeout_s
        self._on_broken = on_broken

    def call(self, rank: int, fn: Callable[[], Any]) -> Any:
        return wait_ready([self.actors[rank].call.remote(fn)], self._timeout_s, f"A set-up call on rank {rank}")[0]

    def gather(self, refs: Sequence[Any]) -> list[Any]:
        """Results of one call per rank, in rank order. The first failure raises at once, naming its rank.

        When the other workers finish within a short grace the executor stays usable; otherwise (or when a
        worker died) it is shut down, so nothing is left hanging.
        """
        import ray

        failed: tuple[type[Exception], ...] = (
            ray.exceptions.RayTaskError,
            ray.exceptions.RayActorError,
            *unserializable_types(),
        )
        pending = {ref: rank for rank, ref in enumerate(refs)}
        while True:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=_POLL_S)
            if len(ready) == len(pending):
                try:  # the common case: every call done, fetched in one round trip
                    return list(ray.get(list(refs)))
                except failed:
                    pass  # find out which rank failed, below
            for ref in ready:
                rank = pending.pop(ref)
                try:
                    ray.get(ref)
                except failed as error:
                    # from None: the message holds the worker's traceback; its cause is the error's `cause`.
                    raise self._failure(rank, error, pending) from None

    def _failure(self, rank: int, error: Exception, others: dict[Any, int]) -> Exception:
        import ray

        node_id = self._placements[rank].node.node_id
        died = worker_actor_died(error)
        failure: Exception
        if died:
            failure = WorkerDiedError(rank, node_id, _first_line(strip_ansi(str(error))))
        else:
            failure = worker_error(rank, node_id, error)
        still_running: list[Any] = []
        if others:
            _, still_running = ray.wait(list(others), num_returns=len(others), timeout=_FAILURE_GRACE_S)
        if died or still_running:
            logger.warning("Rank %s failed and the group cannot go on; shutting the executor down.", rank)
            self._on_broken()
            failure.add_note("The executor was shut down: call start() again to get a new group of workers.")
        return failure


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "no reason given"
