"""Whether a placement could ever be granted: what the cluster can offer, and whether it may grow.

The rule (documented in docs/executor.md, "Start-up"):

- ``ELASTRAIN_CLUSTER_CAN_GROW=1`` in the driver's environment: the cluster may grow without bound, so every
  request waits up to ``placement_group_timeout_s``. ``=0``: the cluster is what it is now.
- Otherwise, an autoscaler that publishes its node groups to Ray (autoscaler v2, KubeRay) bounds the cluster
  by its configured maximum: a request above that maximum can never be granted.
- Otherwise, a head node set up by Ray's cluster launcher (``~/ray_bootstrap_config.yaml`` on the driver's
  machine, the sign Ray Tune also uses) runs an autoscaler of unknown reach: wait.
- Otherwise no autoscaler is configured and the cluster is its alive nodes: a request that does not fit them
  can never be granted.

Only the resources the executor asks for (CPU, GPU) are compared. Ray counts resources in units of 1/10000,
and so does this module, so ``0.1 + 0.2`` CPUs compare the way Ray compares them.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

CAN_GROW_ENV = "ELASTRAIN_CLUSTER_CAN_GROW"
_UNITS = 10_000  # Ray's fixed-point resource granularity


@dataclass(frozen=True)
class Capacity:
    """The most the cluster can ever offer: per node when the nodes are known, else only in total."""

    totals: dict[str, float]
    nodes: tuple[dict[str, float], ...] | None
    source: str  # how the limit was learned, for messages


def cluster_capacity() -> Capacity | None:
    """What the cluster could ever offer, or ``None`` when it may grow without a known bound."""
    can_grow = os.environ.get(CAN_GROW_ENV, "").strip()
    if can_grow not in ("", "0", "1"):
        raise ValueError(
            f"{CAN_GROW_ENV} must be 1 (the cluster may grow), 0 (it will not) or unset; it is {can_grow!r}."
        )
    if can_grow == "1":
        return None
    nodes = _alive_node_resources()
    if can_grow == "":
        maxima = _autoscaler_maxima()
        if maxima is not None:
            now = _sum(nodes)
            return Capacity(
                {k: max(v, now.get(k, 0.0)) for k, v in {**now, **maxima}.items()}, None, "the autoscaler's maximum"
            )
        if Path("~/ray_bootstrap_config.yaml").expanduser().exists():
            return None
    return Capacity(_sum(nodes), tuple(nodes), f"its {len(nodes)} node{'s' if len(nodes) != 1 else ''}")


def most_bundles(bundle: dict[str, float], capacity: Capacity, strategy: str) -> int:
    """How many copies of ``bundle`` the cluster could ever hold at once (bundles are all alike here)."""
    if capacity.nodes is None:
        return _copies(bundle, capacity.totals)
    per_node = [_copies(bundle, node) for node in capacity.nodes]
    if strategy == "STRICT_SPREAD":
        return sum(1 for copies in per_node if copies > 0)
    return sum(per_node)


def _copies(bundle: dict[str, float], resources: dict[str, float]) -> int:
    asked = {name: _fixed(amount) for name, amount in bundle.items() if amount > 0}
    if not asked:
        return sys.maxsize
    return min(_fixed(resources.get(name, 0.0)) // units for name, units in asked.items())


def _fixed(amount: float) -> int:
    return round(amount * _UNITS)


def _sum(nodes: list[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for node in nodes:
        for name, amount in node.items():
            total[name] = total.get(name, 0.0) + amount
    return total


def _alive_node_resources() -> list[dict[str, float]]:
    import ray

    return [dict(node.get("Resources", {})) for node in ray.nodes() if node.get("Alive")]


def _autoscaler_maxima() -> dict[str, float] | None:
    """The maximum resources an autoscaler published to Ray's GCS, or None when none did."""
    try:
        from ray._private.state import state

        maxima = state.get_max_resources_from_cluster_config()
    except Exception:  # a private Ray API: when it moves, fall back to the other signs
        return None
    return {name: float(amount) for name, amount in maxima.items()} if maxima else None
