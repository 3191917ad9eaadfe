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

# Beats per liveness timeout: up to three lost or late beats in a row never look like silence.
_BEATS_PER_TIMEOUT = 4
_MIN_INTERVAL_S = 0.1
_MAX_INTERVAL_S = 2.0
# Every beat is a call into the job's one rendezvous actor (about a millisecond of its CPU): a large job spreads
# its beats out to stay near this many a second, as far as its liveness timeout allows (benchmarks/scale: 1,024
# workers at the 2 s interval cost the actor about a core; docs/scale.md).
JOB_BEATS_PER_S = 200.0


def beat_interval(liveness_timeout_s: float, world_size: int = 1) -> float:
    """Seconds between beats: a quarter of the liveness timeout, at most 2 s for a small job, and longer for a
    large one so that the job's beats stay near JOB_BEATS_PER_S (never past a quarter of the timeout)."""
    floor = min(max(liveness_timeout_s / _BEATS_PER_TIMEOUT, _MIN_INTERVAL_S), _MAX_INTERVAL_S)
    spread = world_size / JOB_BEATS_PER_S
    return max(floor, min(spread, liveness_timeout_s / _BEATS_PER_TIMEOUT))


class Heartbeat:
    def __init__(
        self,
        coordinator: Any,
        worker_id: str,
        liveness_timeout_s: float,
        commits: Callable[[], int] = lambda: 0,
        world_size: Callable[[], int] = lambda: 1,
    ) -> None:
        self._coordinator = coordinator
        self._worker_id = worker_id
        self._commits = commits
        self._world_size = world_size
        self._liveness_timeout_s = liveness_timeout_s
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
        import ray

        pending = None
        while not self._stopped.is_set():
            try:
                # Fire and forget: a beat that is late or lost is made up by the next one. At most one is on its
                # way: while the rendezvous actor has not taken the last, it is behind, and more beats would only
                # queue up ahead of the driver's calls (the one on its way tells it this worker lives).
                if pending is None or ray.wait([pending], timeout=0)[0]:
                    pending = self._coordinator.beat.remote(self._worker_id, self._commits())
            except Exception:  # the rendezvous is gone (the call is ending): nothing left to tell
                return
            self._interval = beat_interval(self._liveness_timeout_s, self._world_size())
            self._stopped.wait(self._interval)
