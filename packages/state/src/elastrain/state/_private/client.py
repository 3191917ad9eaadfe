"""Finding (or creating) the cluster's state actor."""

from __future__ import annotations

from typing import Any

from elastrain.state._private.actor import STATE_ACTOR_NAME, STATE_ACTOR_NAMESPACE, StateActor
from elastrain.state._private.options import (
    DEFAULT_DRIVER_CHECK_INTERVAL_S,
    DEFAULT_IO_TIMEOUT_S,
    DEFAULT_MAX_HISTORIES,
    DEFAULT_MAX_RUNS,
    DEFAULT_SNAPSHOT_INTERVAL_S,
    check_max_runs,
    check_seconds,
    resolve_persistence,
)


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
    io_timeout_s: float = DEFAULT_IO_TIMEOUT_S,
    driver_check_interval_s: float = DEFAULT_DRIVER_CHECK_INTERVAL_S,
    max_histories: int = DEFAULT_MAX_HISTORIES,
) -> Any:
    """The cluster's state actor, created when absent: safe when many drivers call it at once.

        Detached (it outlives the driver), restarted by Ray when it dies, on the head node, using no CPU, and never
        inside the caller's placement group. Persistence is on: to ``snapshot_uri`` (any fsspec URI or absolute
        folder), else to the ``ELASTRAIN_STATE_SNAPSHOT_URI`` environment variable's (``default``: the embedded
        default; ``off``: none), else to the embedded default, a folder of the actor's own on the head node that
        outlives its restarts. ``persist=False`` turns it off. ``max_histories``: how many of the newest runs keep their
    history (metrics, events, departed workers). The options apply when this call creates the actor;
        an existing actor keeps its own.
    """
    import ray

    check_max_runs(max_runs)
    check_max_runs(max_histories, "max_histories")
    check_seconds("snapshot_interval_s", snapshot_interval_s)
    check_seconds("io_timeout_s", io_timeout_s)
    check_seconds("driver_check_interval_s", driver_check_interval_s)
    uri, persist_on = resolve_persistence(snapshot_uri, persist)
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
            # An explicit strategy: a caller inside a placement group that captures child tasks would otherwise
            # place the actor in its group (where it can never be scheduled, or dies with the group).
            scheduling_strategy="DEFAULT",
        )
        .remote(
            max_runs,
            uri,
            snapshot_interval_s,
            persist=persist_on,
            io_timeout_s=io_timeout_s,
            driver_check_interval_s=driver_check_interval_s,
            max_histories=max_histories,
        )
    )
