"""The Ray side of an elastic call's workers: their actors, calls in flight, and how the shell starts and stops them."""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from elastrain.executor._private.node import NodeInfo
from elastrain.executor._private.options import ExecutorOptions
from elastrain.executor._private.placement import node_alive, pin_to_host

logger = logging.getLogger("elastrain.executor")

# What an elastic worker imports before it joins a group: what it needs, and a head start (Worker.prepare).
_PRELOADED = (("torch.distributed",), ("torch._dynamo",))


class NoBundleError(RuntimeError):
    """The job's placement group has no bundle on the host any more (its node was lost)."""


class BundleDiscovery(Protocol):
    """What the pool needs of ``elastrain.discovery.PlacementGroupHostDiscovery``."""

    placement_group: Any

    def bundles_on(self, host_id: str) -> dict[int, int]: ...


@dataclass
class WorkerHandle:
    """What the shell holds of a worker: its actor, its calls in flight, where it runs."""

    worker_id: str
    host_id: str  # "" for a spare until Ray placed it
    actor: Any
    prepare_ref: Any
    node: NodeInfo | None = None  # where it runs, once prepare() answered
    run_ref: Any = None  # its run_elastic call, once started
    bundle: int | None = None  # its placement group bundle, when the job runs in one
    holds_bundle: bool = True  # until it is stopped

    @property
    def prepared(self) -> bool:
        return self.node is not None


class WorkerPool:
    """Starts and stops the workers of one call: pinned to a host's node, or, when the job runs in a placement
    group (``bundles``), to a bundle of that group placed on the host. Which phase a worker is in is the driver
    core's business; the pool only holds handles."""

    def __init__(self, options: ExecutorOptions, worker_class: Any, bundles: BundleDiscovery | None = None) -> None:
        self.options = options
        self.worker_class = worker_class
        self.bundles = bundles
        self._workers: dict[str, WorkerHandle] = {}
        self._retired: list[Any] = []  # handles of workers no longer tracked, killed when the call ends
        self._lock = threading.Lock()  # shutdown() may kill everything from another thread
        self._killer_nodes: set[str] = set()

    def __iter__(self) -> Iterator[WorkerHandle]:
        return iter(list(self._workers.values()))

    def get(self, worker_id: str) -> WorkerHandle | None:
        return self._workers.get(worker_id)

    def spawn(self, worker_id: str, host_id: str) -> WorkerHandle:
        """Start a worker pinned to ``host_id``, or a spare for Ray to place (``host_id`` "")."""
        if not host_id:
            return self._start(worker_id, "")
        if self.bundles is None:
            return self._start(worker_id, host_id, **pin_to_host(host_id))
        bundle = self._free_bundle(self.bundles, host_id)
        worker = self._start(worker_id, host_id, **_in_bundle(self.bundles, bundle))
        worker.bundle = bundle
        return worker

    def _free_bundle(self, bundles: BundleDiscovery, host_id: str) -> int:
        """The bundle on ``host_id`` with the most room left; the driver never asks for more workers on a host than
        its bundles hold, so one with room exists unless a stopped worker still holds its place (then Ray starts
        the new one as soon as the old one's resources are freed)."""
        on_host = bundles.bundles_on(host_id)
        if not on_host:
            raise NoBundleError(f"No bundle of the job's placement group is on host {host_id} any more.")
        taken = collections.Counter(w.bundle for w in self if w.bundle is not None and w.holds_bundle)
        return max(sorted(on_host), key=lambda index: on_host[index] - taken[index])

    def stop(self, worker: WorkerHandle, *, unresponsive: bool = False) -> None:
        """Kill ``worker``. One that does not answer (stopped, hung) is also SIGKILLed on its node: Ray's own kill
        waits seconds for a stopped process, and its peers' collectives fail only once its sockets close."""
        import ray

        worker.holds_bundle = False
        if unresponsive and worker.node is not None:
            with contextlib.suppress(Exception):  # its node is gone: nothing left to kill there
                _kill_on_node(worker.node.node_id, worker.node.pid)
        ray.kill(worker.actor, no_restart=True)

    def kill(self, worker: WorkerHandle) -> None:
        """Kill ``worker``'s actor at once, without the bookkeeping of :meth:`stop`."""
        import ray

        ray.kill(worker.actor, no_restart=True)

    def node_alive(self, node_id: str) -> bool:
        """Whether Ray counts node ``node_id``, where a worker ran, as alive."""
        return node_alive(node_id)

    def ready_to_kill_on(self, node: NodeInfo) -> None:
        """Run the process killer once on ``node`` (a no-op), so that a Ray worker process for it idles there.

        An eviction then kills at once; without one, Ray first starts a process (a second or more on a busy
        node), and the evicted worker's peers stay blocked in their collective meanwhile.
        """
        if node.node_id in self._killer_nodes:
            return
        self._killer_nodes.add(node.node_id)
        with contextlib.suppress(Exception):  # only a head start
            _kill_on_node(node.node_id, 0)

    def forget(self, worker: WorkerHandle) -> None:
        with self._lock:
            self._workers.pop(worker.worker_id, None)
            # Killed when the call ends even if its process still runs: a handle kept alive elsewhere (say, by an
            # error's traceback) must not keep an idle worker holding its CPUs.
            self._retired.append(worker.actor)

    def stop_all(self) -> None:
        """Kill every worker, tracked or retired (safe from another thread)."""
        import ray

        with self._lock:
            actors = [w.actor for w in self._workers.values()] + self._retired
            self._workers.clear()
            self._retired = []
        for actor in actors:
            with contextlib.suppress(Exception):  # already gone: nothing to stop
                ray.kill(actor, no_restart=True)

    def _start(self, worker_id: str, host_id: str, **placement: Any) -> WorkerHandle:
        actor = self.worker_class.options(
            num_cpus=self.options.cpus_per_worker, num_gpus=self.options.gpus_per_worker, max_restarts=0, **placement
        ).remote()
        worker = WorkerHandle(worker_id, host_id, actor, actor.prepare.remote(*_PRELOADED))
        with self._lock:
            self._workers[worker_id] = worker
        return worker


def _in_bundle(bundles: BundleDiscovery, bundle: int) -> dict[str, Any]:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    strategy = PlacementGroupSchedulingStrategy(
        placement_group=bundles.placement_group,
        placement_group_bundle_index=bundle,
        placement_group_capture_child_tasks=False,
    )
    return {"scheduling_strategy": strategy}


def _kill_on_node(node_id: str, pid: int) -> None:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
    _process_killer().options(scheduling_strategy=strategy).remote(pid)


@functools.cache
def _process_killer() -> Any:
    import ray

    return ray.remote(num_cpus=0, max_retries=0)(kill_ray_worker_process)


def kill_ray_worker_process(pid: int) -> bool:
    """SIGKILL process ``pid`` on this node if it is still a Ray worker (Ray titles those ``ray::...``).

    ``pid`` 0 does nothing: it warms a process up for later kills.
    """
    if pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            if not cmdline.read().startswith(b"ray::"):
                return False  # gone, and its pid reused
    except OSError:
        return False  # gone (or no /proc here: Ray's own kill does it, only later)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return True
