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


def check_can_place(bundles: list[dict[str, float]], strategy: str = "PACK", *, what: str = "This request") -> None:
    """Raise :class:`~elastrain.executor.PlacementError` when the cluster can never grant a placement group of
    ``bundles`` with ``strategy`` (the rule above decides whether the cluster may grow; if it may, pass).

    Bundles may differ (a driver's bundle and its workers'): they are fitted largest first onto the nodes, each
    on a node of its own for ``STRICT_SPREAD`` and all on one node for ``STRICT_PACK``.
    """
    from elastrain.executor._private.errors import PlacementError

    if strategy not in ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"):
        raise ValueError(f"strategy must be PACK, SPREAD, STRICT_PACK or STRICT_SPREAD, got {strategy!r}.")
    capacity = cluster_capacity()
    if capacity is None or not bundles:
        return
    asked = _sum([dict(b) for b in bundles])
    short = [name for name, amount in asked.items() if _fixed(amount) > _fixed(capacity.totals.get(name, 0.0))]
    if not short and capacity.nodes is not None and not _fits_on_nodes(bundles, list(capacity.nodes), strategy):
        short = ["room on the nodes"]
    if not short:
        return
    raise PlacementError(
        f"{what} asks for {len(bundles)} bundles ({_list(bundles)}, strategy {strategy}) but the cluster can never "
        f"hold them: it has {_describe(capacity.totals, sorted(asked))} in total ({capacity.source}), "
        f"short of {', '.join(short)}. "
        "Ask for fewer workers or resources, use a less strict strategy, or add nodes "
        f"(if nodes will join, set {CAN_GROW_ENV}=1 to wait for them)."
    )


def _fits_on_nodes(bundles: list[dict[str, float]], nodes: list[dict[str, float]], strategy: str) -> bool:
    free = [{name: _fixed(amount) for name, amount in node.items()} for node in nodes]
    wanted = sorted(
        ({name: _fixed(amount) for name, amount in bundle.items() if amount > 0} for bundle in bundles),
        key=lambda bundle: sorted(bundle.values(), reverse=True),
        reverse=True,
    )
    if strategy == "STRICT_PACK":
        total = _sum([{k: float(v) for k, v in b.items()} for b in wanted])
        return any(all(node.get(k, 0) >= v for k, v in total.items()) for node in free)
    used: set[int] = set()
    for bundle in wanted:
        for index, node in enumerate(free):
            if strategy == "STRICT_SPREAD" and index in used:
                continue
            if all(node.get(name, 0) >= amount for name, amount in bundle.items()):
                for name, amount in bundle.items():
                    node[name] -= amount
                used.add(index)
                break
        else:
            return False
    return True


def _list(bundles: list[dict[str, float]]) -> str:
    shapes: dict[str, int] = {}
    for bundle in bundles:
        shape = "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(bundle.items())) + "}"
        shapes[shape] = shapes.get(shape, 0) + 1
    return ", ".join(f"{count} × {shape}" for shape, count in shapes.items())


def _describe(resources: dict[str, float], names: list[str]) -> str:
    return ", ".join(f"{resources.get(name, 0.0):g} {name}" for name in names)
