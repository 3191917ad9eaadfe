"""The workers of one elastic call: their lifecycle, and how the driver starts and stops them."""

from __future__ import annotations

import collections
import contextlib
import enum
import functools
import itertools
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from elastrain.executor._private.node import NodeInfo
from elastrain.executor._private.options import ExecutorOptions
from elastrain.executor._private.placement import pin_to_host

logger = logging.getLogger("elastrain.executor")

# What an elastic worker imports before it joins a group: what it needs, and a head start (Worker.prepare).
_PRELOADED = (("torch.distributed",), ("torch._dynamo",))


class BundleDiscovery(Protocol):
    """What the pool needs of ``elastrain.discovery.PlacementGroupHostDiscovery``."""

    placement_group: Any

    def bundles_on(self, host_id: str) -> dict[int, int]: ...


class Phase(enum.Enum):
    SPARE = "spare"  # started without a host, for Ray to place the moment a node with room appears
    STARTING = "starting"  # its actor starts and imports torch (prepare)
    READY = "ready"  # runs the job's function and waits to be published into a world
    MEMBER = "member"  # in a published world: it holds committed state
    LEAVING = "leaving"  # its host went away gracefully: left out of the next world, it stops at its next commit
    STOPPING = "stopping"  # the driver killed it (evicted, did not start, host lost, call ending)


@dataclass
class PoolWorker:
    worker_id: str
    host_id: str  # "" for a spare until Ray placed it
    actor: Any
    prepare_ref: Any
    phase: Phase
    node: NodeInfo | None = None  # where it runs, once prepare() answered
    run_ref: Any = None  # its run_elastic call, once started
    spawned_at: float = field(default_factory=time.monotonic)
    bundle: int | None = None  # its placement group bundle, when the job runs in one

    @property
    def joined(self) -> bool:
        """Whether it has been published into a world (so it holds committed state; ranks put it first)."""
        return self.phase is Phase.MEMBER

    @property
    def counts(self) -> bool:
        """Whether it counts towards the job's size (slots, max_workers, min_workers)."""
        return self.phase in (Phase.STARTING, Phase.READY, Phase.MEMBER)


class WorkerPool:
    """Starts and stops the workers of one call: pinned to a host's node, or, when the job runs in a placement
    group (``bundles``), to a bundle of that group placed on the host."""

    def __init__(self, options: ExecutorOptions, worker_class: Any, bundles: BundleDiscovery | None = None) -> None:
        self.options = options
        self.worker_class = worker_class
        self.bundles = bundles
        self._ids = itertools.count()
        self._workers: dict[str, PoolWorker] = {}
        self._retired: list[Any] = []  # handles of workers no longer tracked, killed when the call ends
        self._lock = threading.Lock()  # shutdown() may kill everything from another thread
        self._killer_nodes: set[str] = set()

    def __iter__(self) -> Iterator[PoolWorker]:
        return iter(list(self._workers.values()))

    def get(self, worker_id: str) -> PoolWorker | None:
        return self._workers.get(worker_id)

    def counted(self) -> list[PoolWorker]:
        return [w for w in self if w.counts]

    def in_phase(self, *phases: Phase) -> list[PoolWorker]:
        return [w for w in self if w.phase in phases]

    def spawn(self, host_id: str) -> PoolWorker:
        if self.bundles is None:
            worker = self._start(host_id, Phase.STARTING, **pin_to_host(host_id))
        else:
            bundle = self._free_bundle(self.bundles, host_id)
            worker = self._start(host_id, Phase.STARTING, **_in_bundle(self.bundles, bundle))
            worker.bundle = bundle
        logger.info("Starting worker %s on host %s.", worker.worker_id, host_id)
        return worker

    def _free_bundle(self, bundles: BundleDiscovery, host_id: str) -> int:
        """The bundle on ``host_id`` with the most room left; the driver never asks for more workers on a host than
        its bundles hold, so one with room exists unless a stopped worker still holds its place (then Ray starts
        the new one as soon as the old one's resources are freed)."""
        on_host = bundles.bundles_on(host_id)
        if not on_host:
            raise RuntimeError(f"No bundle of the job's placement group is on host {host_id} any more.")
        holding = (Phase.STARTING, Phase.READY, Phase.MEMBER, Phase.LEAVING)  # a leaving worker holds its place
        taken = collections.Counter(w.bundle for w in self.in_phase(*holding) if w.bundle is not None)
        return max(sorted(on_host), key=lambda index: on_host[index] - taken[index])

    def spawn_spare(self) -> PoolWorker:
        worker = self._start("", Phase.SPARE)
        logger.debug("Keeping spare worker %s for a node that may join.", worker.worker_id)
        return worker

    def stop(self, worker: PoolWorker, *, unresponsive: bool = False) -> None:
        """Kill ``worker``. One that does not answer (stopped, hung) is also SIGKILLed on its node: Ray's own kill
        waits seconds for a stopped process, and its peers' collectives fail only once its sockets close."""
        import ray

        worker.phase = Phase.STOPPING
        if unresponsive and worker.node is not None:
            with contextlib.suppress(Exception):  # its node is gone: nothing left to kill there
                _kill_on_node(worker.node.node_id, worker.node.pid)
        ray.kill(worker.actor, no_restart=True)

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

    def forget(self, worker: PoolWorker) -> None:
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
            for worker in self._workers.values():
                worker.phase = Phase.STOPPING
            self._workers.clear()
            self._retired = []
        for actor in actors:
            with contextlib.suppress(Exception):  # already gone: nothing to stop
                ray.kill(actor, no_restart=True)

    def _start(self, host_id: str, phase: Phase, **placement: Any) -> PoolWorker:
        actor = self.worker_class.options(
            num_cpus=self.options.cpus_per_worker, num_gpus=self.options.gpus_per_worker, max_restarts=0, **placement
        ).remote()
        worker = PoolWorker(f"w{next(self._ids)}", host_id, actor, actor.prepare.remote(*_PRELOADED), phase)
        with self._lock:
            self._workers[worker.worker_id] = worker
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
