"""A worker's watch for newer worlds: one long-poll call pending on the rendezvous actor at all times.

At every commit a worker must know whether the driver published a newer world (hosts came or went). Asking the
rendezvous actor at each commit cost one call per worker per commit: at 1,024 workers committing every second,
a thousand calls a second that almost always answered "nothing new". This thread keeps one ``watch`` call
pending instead; it answers once per published world, so a commit only reads a number here, and asks the
rendezvous actor for the new world's members only when there is one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from elastrain.executor._private.elastic.coordinator import CONTROL_TIMEOUT_S
from elastrain.executor._private.errors import first_line

logger = logging.getLogger("elastrain.executor")

# How long one watch call waits on the rendezvous actor before it is renewed.
_WATCH_S = 30.0


class WorldWatch:
    def __init__(self, coordinator: Any, own_generation: Callable[[], int]) -> None:
        self._coordinator = coordinator
        self._own_generation = own_generation
        self._latest = 0  # the newest generation the rendezvous actor announced
        self._working = True  # False once a watch call failed: callers then ask the rendezvous actor themselves
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="elastrain-world-watch", daemon=True)

    def start(self) -> WorldWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop renewing the call (the one pending ends with its timeout or with the rendezvous actor)."""
        self._stopped.set()

    def newer_than(self, generation: int) -> bool:
        """Whether a world newer than ``generation`` may have been published; True while the watch cannot tell."""
        return not self._working or self._latest > generation

    def _run(self) -> None:
        import ray

        while not self._stopped.is_set():
            after = max(self._latest, self._own_generation())
            try:
                found = ray.get(self._coordinator.watch.remote(after, _WATCH_S), timeout=_WATCH_S + CONTROL_TIMEOUT_S)
            except Exception as error:  # the rendezvous is gone (the call is ending) or stuck: commits ask it
                if not self._stopped.is_set():
                    logger.debug("Watching for new groups stopped: %s", first_line(error))
                self._working = False
                return
            if found is not None:
                self._latest = max(self._latest, int(found))
