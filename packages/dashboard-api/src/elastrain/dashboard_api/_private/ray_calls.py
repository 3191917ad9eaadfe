"""Blocking calls to Ray's control store (GCS), bounded in time, and the actor lookups made through them.

``ray.get_actor`` and the actor-table reads wait for the GCS with no timeout of their own (Ray's is 60 s, after
which a driver may give up on the cluster). Each runs in a daemon thread the request waits on for at most its
deadline; a call that outlives it finishes in the background. A fixed number of such calls may be in flight,
so a GCS that stops answering cannot pile up threads: further requests are refused at once until it answers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar

T = TypeVar("T")

MAX_IN_FLIGHT = 8
# Ray's actor states in which an actor exists and will run (or runs again): a controller in one of them is
# present. PENDING_CREATION and DEPENDENCIES_UNREADY: the executor starts its controller without waiting.
PRESENT_STATES = frozenset({"ALIVE", "DEPENDENCIES_UNREADY", "PENDING_CREATION", "RESTARTING"})


class RayTimeout(Exception):
    """Ray did not answer in time, or too many earlier calls are still waiting for it."""


class BoundedCalls:
    """Runs blocking calls with a deadline, at most ``limit`` at once."""

    def __init__(self, limit: int = MAX_IN_FLIGHT) -> None:
        self._limit = limit
        self._slots = threading.BoundedSemaphore(limit)

    def run(self, call: Callable[[], T], timeout_s: float, what: str) -> T:
        if timeout_s <= 0:
            raise RayTimeout(f"no time was left to ask Ray for {what}")
        if not self._slots.acquire(blocking=False):
            raise RayTimeout(f"{self._limit} earlier requests to Ray are still waiting for an answer")
        result: Future[T] = Future()

        def work() -> None:
            try:
                result.set_result(call())
            except BaseException as error:
                result.set_exception(error)
            finally:
                self._slots.release()

        threading.Thread(target=work, name="elastrain-dashboard-ray-call", daemon=True).start()
        try:
            return result.result(timeout=timeout_s)
        except FutureTimeout:
            raise RayTimeout(f"Ray did not answer {what} in time") from None


def actor_states(actor_ids: Iterable[str]) -> dict[str, str]:
    """Ray's state name for each of these actors (absent when Ray does not know it): one point lookup per actor,
    never a read of the whole actor table, so the cost follows the page, not the cluster."""
    from ray._private.state import state

    states = {}
    for actor_id in actor_ids:
        try:
            info = state.actor_table(actor_id)
        except ValueError:  # not an actor id at all (stored by hand): no such actor
            continue
        if info:
            states[actor_id] = str(info.get("State"))
    return states
