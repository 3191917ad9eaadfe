"""A worker's heartbeat: a thread that tells the rendezvous actor the process still runs.

It needs nothing from the training code: a worker that is busy (a long evaluation, a slow data loader, a
collective waiting on others) keeps beating, while one that stopped (SIGSTOP, a host that no longer answers)
goes silent, and the driver evicts it once it has been silent for ``liveness_timeout_s``. Each beat also carries
how many commits the worker's state holds, from which the rendezvous actor keeps the job's high-water mark.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

# Beats per liveness timeout: up to three lost or late beats in a row never look like silence. Every beat is a
# call into the job's rendezvous actor, so this is also its floor of calls per worker: 0.5/s at the default 8 s
# (eight per timeout, at most one a second, cost a 1,024-worker job twice that; see benchmarks/scale).
_BEATS_PER_TIMEOUT = 4
_MIN_INTERVAL_S = 0.1
_MAX_INTERVAL_S = 2.0


def beat_interval(liveness_timeout_s: float) -> float:
    return min(max(liveness_timeout_s / _BEATS_PER_TIMEOUT, _MIN_INTERVAL_S), _MAX_INTERVAL_S)


class Heartbeat:
    def __init__(
        self, coordinator: Any, worker_id: str, liveness_timeout_s: float, commits: Callable[[], int] = lambda: 0
    ) -> None:
        self._coordinator = coordinator
        self._worker_id = worker_id
        self._commits = commits
        self._interval = beat_interval(liveness_timeout_s)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"elastrain-heartbeat-{worker_id}", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=self._interval + 1.0)

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                # Fire and forget: a beat that is late or lost is made up by the next one.
                self._coordinator.beat.remote(self._worker_id, self._commits())
            except Exception:  # the rendezvous is gone (the call is ending): nothing left to tell
                return
            self._stopped.wait(self._interval)
