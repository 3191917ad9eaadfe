"""What an executor trial's workers see: the trial's persistence, for ``state.persist_with(...)``.

Imported on the workers; imports neither Ray Tune nor the driver side.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

_current: Any = None


# Workers that start this long after the trial began are replacements: they get the committed state from their
# peers at the next sync, so loading the persisted copy would only move bytes.
PREFETCH_WINDOW_S = 60.0


def run_trial_function(
    train_fn: Callable[[dict[str, Any]], Any], config: dict[str, Any], persistence: Any, started_at: float
) -> Any:
    """Runs on every worker: make the trial's persistence current and, on the workers the trial starts with,
    start loading its latest state (a restarted trial resumes from it; the download overlaps building the
    model), then run the user's function."""
    global _current
    _current = persistence
    # A sharded state loads its checkpoint on every rank at once, resharded: nothing to fetch ahead.
    if time.time() - started_at < PREFETCH_WINDOW_S and hasattr(persistence, "prefetch"):
        persistence.prefetch()
    try:
        return train_fn(config)
    finally:
        _current = None


def trial_persistence() -> Any:
    """The running trial's ``elastrain.durable.StatePersistence``, on a worker of an executor trial::

    state = elastic.TorchState(model, optimizer, epoch=0)
    state.persist_with(elastrain.tune.trial_persistence())

    In a trial made with ``executor_trainable(..., sharded=True)`` it is a ``ShardedStatePersistence``, for an
    ``elastic.ShardedTorchState``.
    """
    if _current is None:
        raise RuntimeError(
            "trial_persistence() is for the workers of a trial made by elastrain.tune.executor_trainable; "
            "this process runs none."
        )
    return _current
