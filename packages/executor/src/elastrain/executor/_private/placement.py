"""Where workers run: the placement group, and each worker's ranks once the actors are up."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from elastrain.discovery import SlotInfo, assign_slots
from elastrain.executor._private.capacity import CAN_GROW_ENV, cluster_capacity, most_bundles
from elastrain.executor._private.errors import PlacementError
from elastrain.executor._private.node import NodeInfo


@dataclass(frozen=True)
class WorkerPlacement:
    """One worker's ranks and host, as backends see it. ``index`` is its actor's creation order."""

    index: int
    slot: SlotInfo
    node_rank: int
    num_nodes: int
    node: NodeInfo
    visible_gpu_ids: tuple[str, ...]

    @property
    def rank(self) -> int:
        return self.slot.rank


@dataclass(frozen=True)
class PlacementPlan:
    """Bundles to reserve and which bundle each worker uses."""

    bundles: list[dict[str, float]]
    strategy: str
    bundle_of_worker: list[int]


def plan_placement(
    *,
    num_workers: int | None,
    num_hosts: int | None,
    num_workers_per_host: int,
    cpus_per_worker: float,
    gpus_per_worker: float,
) -> PlacementPlan:
    worker_bundle = {"CPU": float(cpus_per_worker)}
    if gpus_per_worker:
        worker_bundle["GPU"] = float(gpus_per_worker)
    if num_workers is not None:
        return PlacementPlan([dict(worker_bundle)] * num_workers, "PACK", list(range(num_workers)))
    if num_hosts is None:
        raise ValueError("plan_placement needs num_workers or num_hosts.")
    host_bundle = {resource: amount * num_workers_per_host for resource, amount in worker_bundle.items()}
    return PlacementPlan(
        [dict(host_bundle)] * num_hosts,
        "STRICT_SPREAD",
        [host for host in range(num_hosts) for _ in range(num_workers_per_host)],
    )


def reserve(plan: PlacementPlan, timeout_s: float) -> Any:
    """Create the placement group and wait until the cluster grants it; on timeout remove it and explain.

    A request the cluster can never grant (see :mod:`.capacity` for when the cluster may grow) fails at once.
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    check_possible(plan)
    group = placement_group(plan.bundles, strategy=plan.strategy, name="")
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if ready:
        return group
    remove_placement_group(group)
    available = ray.available_resources()
    total = ray.cluster_resources()
    raise PlacementError(
        f"The cluster could not place {len(plan.bundles)} bundles of {plan.bundles[0]} with strategy "
        f"{plan.strategy} within placement_group_timeout_s={timeout_s}. The cluster has "
        f"{_describe(total)} in total and {_describe(available)} free across {len(ray.nodes())} nodes. "
        "Ask for fewer workers or resources, add nodes, or raise placement_group_timeout_s."
        + (" STRICT_SPREAD needs one node per host." if plan.strategy == "STRICT_SPREAD" else "")
    )


def check_possible(plan: PlacementPlan) -> None:
    """Raise :class:`PlacementError` when the cluster can never hold the plan's bundles."""
    capacity = cluster_capacity()
    if capacity is None or not plan.bundles:
        return
    bundle = plan.bundles[0]
    most = most_bundles(bundle, capacity, plan.strategy)
    if most >= len(plan.bundles):
        return
    wanted = len(plan.bundles)
    keys = sorted(bundle)
    asked = {name: amount * wanted for name, amount in bundle.items()}
    if plan.strategy == "STRICT_SPREAD":
        what = f"num_hosts={wanted} hosts, each a node with {_describe(bundle, keys)} for its workers,"
        change = f"num_hosts={most} or fewer" if most else "fewer workers per host or fewer resources per worker"
        room = f"only {most} of its nodes {'has' if most == 1 else 'have'} that much"
    else:
        what = f"num_workers={wanted} workers with {_describe(bundle, keys)} each ({_describe(asked, keys)} in all)"
        change = f"num_workers={most} or fewer" if most else "fewer resources per worker"
        room = f"room for {most} such workers"
    if "GPU" in bundle and not capacity.totals.get("GPU"):
        change = "use_gpu=False (the cluster has no GPU)"
    grow = (
        "An autoscaler is configured but cannot grow the cluster beyond that."
        if capacity.nodes is None
        else f"No autoscaler is configured (if nodes will join, set {CAN_GROW_ENV}=1 to wait for them)."
    )
    raise PlacementError(
        f"This executor asks for {what} but the cluster can never hold that: it has {_describe(capacity.totals, keys)} "
        f"in total ({capacity.source}), {room}. {grow} Ask for {change}, or add nodes."
    )


def _describe(resources: dict[str, float], keys: Sequence[str] | None = None) -> str:
    """``"2 CPU, 1 GPU"``: the given keys (0 when absent), else whichever of CPU and GPU are present."""
    names = keys if keys is not None else [k for k in ("CPU", "GPU") if k in resources]
    return ", ".join(f"{resources.get(k, 0.0):g} {k}" for k in names) or "no CPU or GPU"


def assign_ranks(nodes: Sequence[NodeInfo]) -> list[WorkerPlacement]:
    """Ranks for workers whose actors run on ``nodes`` (one entry per actor, in creation order).

    Hosts are taken in the order their first worker was created, and each host's workers get consecutive
    ranks, so local ranks are contiguous (what hierarchical collectives expect).
    """
    by_node: dict[str, list[int]] = {}
    for index, node in enumerate(nodes):
        by_node.setdefault(node.node_id, []).append(index)
    slots = assign_slots({node_id: len(indexes) for node_id, indexes in by_node.items()}, len(nodes))
    node_rank = {node_id: i for i, node_id in enumerate(by_node)}
    visible = {
        node_id: tuple(sorted({gpu for i in indexes for gpu in nodes[i].gpu_ids}, key=_gpu_sort_key))
        for node_id, indexes in by_node.items()
    }
    next_on_node = dict.fromkeys(by_node, 0)
    placements = []
    for slot in slots:
        index = by_node[slot.host_id][next_on_node[slot.host_id]]
        next_on_node[slot.host_id] += 1
        placements.append(
            WorkerPlacement(
                index=index,
                slot=slot,
                node_rank=node_rank[slot.host_id],
                num_nodes=len(by_node),
                node=nodes[index],
                visible_gpu_ids=visible[slot.host_id],
            )
        )
    return placements


def _gpu_sort_key(gpu_id: str) -> tuple[int, str]:
    return (int(gpu_id), gpu_id) if gpu_id.isdigit() else (1 << 30, gpu_id)


def wait_ready(refs: list[Any], timeout_s: float, what: str) -> list[Any]:
    """``ray.get`` with a deadline that names what was awaited."""
    import ray

    start = time.monotonic()
    try:
        return list(ray.get(refs, timeout=timeout_s))
    except ray.exceptions.GetTimeoutError:
        raise TimeoutError(
            f"{what} did not finish within timeout_s={timeout_s} (waited {time.monotonic() - start:.1f} s); "
            "the cluster may be overloaded. Raise timeout_s in RayExecutor.create_settings()."
        ) from None


def control_actor_options() -> dict[str, Any]:
    """Options for the executor's own zero-CPU actors (messages, rendezvous): on the driver's node.

    Left to Ray, a zero-CPU actor may land on any node, and losing that node would lose the job's control
    plane; the driver's node lives as long as the job does.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    driver_node = ray.get_runtime_context().get_node_id()
    return {"num_cpus": 0, "scheduling_strategy": NodeAffinitySchedulingStrategy(driver_node, soft=False)}


def pin_to_host(host_id: str) -> dict[str, Any]:
    """Pin a worker to a host: a Ray node id gets node affinity; another name a ``node:<name>`` resource."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if is_node_id(host_id):
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(host_id, soft=False)}
    return {"resources": {f"node:{host_id}": 0.001}}


def is_node_id(host_id: str) -> bool:
    return len(host_id) == 56 and all(c in "0123456789abcdef" for c in host_id)


def node_alive(node_id: str) -> bool:
    import ray

    return any(node["NodeID"] == node_id and node.get("Alive") for node in ray.nodes())
