"""One tracker's calls for one run, made on a thread of their own, behind a bounded queue.

The executor calls its observers on the driver's thread. A tracker's client may block for minutes (MLflow retries a
server that is down with backoff; W&B waits on its service), so nothing of a tracker runs there: every call is
queued, and a full queue drops the call with one warning instead of waiting. At the end of a run the queue gets a
deadline to drain; what is left then is dropped, and said.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("elastrain.trackers")

# Calls waiting per tracker and run. Metrics come batched, at most about one call a second, so this is minutes of a
# tracker that stopped answering.
MAX_PENDING_CALLS = 1_000

_STOP = object()


class Background:
    """Calls ``submit``-ted for one tracker, made in order on one thread; never blocks the caller."""

    def __init__(self, name: str, capacity: int = MAX_PENDING_CALLS) -> None:
        self.name = name
        self.dropped = 0  # calls dropped because the queue was full or closed
        self.failures = 0  # calls that raised
        self._queue: queue.Queue[Any] = queue.Queue(capacity)
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=f"elastrain-tracker-{name}", daemon=True)
        self._thread.start()

    def submit(self, call: Callable[..., Any], *args: Any) -> None:
        if self._closed:
            self.dropped += 1
            return
        try:
            self._queue.put_nowait((call, args))
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1:
                logger.warning(
                    "Tracker %s is behind by %d calls (down or slow?); what the run records meanwhile is dropped for "
                    "it. Training goes on at full speed.",
                    self.name,
                    self._queue.maxsize,
                )

    def close(self, until: float) -> bool:
        """Let the queued calls finish by ``until`` (a ``time.monotonic()`` time); True when they all did."""
        self._closed = True
        with contextlib.suppress(queue.Full):  # still full at the deadline: the thread is stuck in a call
            self._queue.put((_STOP, ()), timeout=max(until - time.monotonic(), 0.0))
        self._thread.join(max(until - time.monotonic(), 0.0))
        if self._thread.is_alive():
            left = self._queue.qsize()
            logger.warning(
                "Tracker %s did not take the end of the run in time; %d calls not delivered to it.",
                self.name,
                left,
            )
            return False
        if self.dropped:
            logger.warning("Tracker %s missed %d calls of this run (it was behind).", self.name, self.dropped)
        return True

    def _work(self) -> None:
        while True:
            call, args = self._queue.get()
            if call is _STOP:
                return
            try:
                call(*args)
            except Exception as error:
                self.failures += 1
                if self.failures == 1:  # one line per tracker and run: a tracker down fails every call
                    logger.warning(
                        "Tracker %s failed (%s: %s); training goes on.", self.name, type(error).__name__, error
                    )
