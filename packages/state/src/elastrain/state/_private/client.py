"""Finding (or creating) the cluster's state actor."""

from __future__ import annotations

import os
from typing import Any

from elastrain.state._private.actor import (
    DEFAULT_MAX_RUNS,
    DEFAULT_SNAPSHOT_DIR,
    DEFAULT_SNAPSHOT_INTERVAL_S,
    STATE_ACTOR_NAME,
    STATE_ACTOR_NAMESPACE,
    StateActor,
)

# Environment: where the actor snapshots (persistence on when set; "default" picks DEFAULT_SNAPSHOT_DIR).
SNAPSHOT_URI_ENV = "ELASTRAIN_STATE_SNAPSHOT_URI"


def get_state_actor() -> Any | None:
    """The cluster's state actor, or None when no one created it (tracking is off)."""
    import ray

    try:
        return ray.get_actor(STATE_ACTOR_NAME, namespace=STATE_ACTOR_NAMESPACE)
    except ValueError:
        return None


def get_or_create_state_actor(
    *,
    max_runs: int = DEFAULT_MAX_RUNS,
    snapshot_uri: str | None = None,
    persist: bool | None = None,
    snapshot_interval_s: float = DEFAULT_SNAPSHOT_INTERVAL_S,
) -> Any:
    """The cluster's state actor, created when absent: safe when many drivers call it at once.

    Detached (it outlives the driver), restarted by Ray when it dies, on the head node, using no CPU.
    Persistence: ``snapshot_uri`` (any fsspec URI or local folder), or ``persist=True`` for a local folder on
    the head node; the ``ELASTRAIN_STATE_SNAPSHOT_URI`` environment variable sets the URI when neither is given.
    The options apply when this call creates the actor; an existing actor keeps its own.
    """
    import ray

    if isinstance(max_runs, bool) or not isinstance(max_runs, int) or max_runs < 1:
        raise ValueError(f"max_runs must be a positive int, got {max_runs!r}.")
    if not snapshot_interval_s > 0:
        raise ValueError(f"snapshot_interval_s must be positive, got {snapshot_interval_s!r}.")
    uri = snapshot_uri or os.environ.get(SNAPSHOT_URI_ENV) or None
    if uri == "default" or (uri is None and persist):
        uri = DEFAULT_SNAPSHOT_DIR
    if persist is False:
        uri = None
    existing = get_state_actor()
    if existing is not None:
        return existing
    return (
        ray.remote(StateActor)
        .options(
            name=STATE_ACTOR_NAME,
            namespace=STATE_ACTOR_NAMESPACE,
            lifetime="detached",
            get_if_exists=True,  # Ray resolves a race between drivers: one actor, every caller gets it
            num_cpus=0,
            max_restarts=-1,
            max_task_retries=-1,
            resources={"node:__internal_head__": 0.001},
        )
        .remote(max_runs, uri, snapshot_interval_s)
    )
