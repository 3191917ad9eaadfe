"""Group forming on the worker side: join the next world, meet its members, build its process group.

Every wait here is bounded. A worker waits on the rendezvous actor in short chunks and goes on waiting only
while the driver keeps polling it (``driver_lease_s``); how long a world may wait for its members is the
driver's call, which it makes from heartbeats and arrivals (see ``driver.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

from elastrain.executor._private.context import _WorkerState
from elastrain.executor._private.elastic.coordinator import CONTROL_TIMEOUT_S
from elastrain.executor._private.elastic.options import ElasticOptions
from elastrain.executor._private.elastic.worker.collectives import collective_device
from elastrain.executor._private.elastic.worker.faults import fault_point
from elastrain.executor._private.elastic.worker.heartbeat import Heartbeat
from elastrain.executor._private.elastic.worker.process_group import ProcessGroup, close_default_group
from elastrain.executor._private.elastic.worker.reset import ResetPlan, gather_counts, plan_reset
from elastrain.executor._private.elastic.worker.world_watch import WorldWatch
from elastrain.executor._private.elastic.world import Member, PackedWorld, World
from elastrain.executor._private.errors import first_line
from elastrain.executor._private.raylet_watch import watch_raylet

logger = logging.getLogger("elastrain.executor")

# One wait on the rendezvous actor lasts at most this long; the worker then checks the driver's lease.
_WAIT_CHUNK_S = 5.0
# Phrases torch.distributed uses when a peer crashed, hung up or timed out; a RuntimeError without one of them
# is the user's own error and fails the job instead of triggering recovery.
_COLLECTIVE_FAILURE_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "connection refused",
    "timed out",
    "gloo/transport",
)
# CleanUpOnly: on a failed NCCL collective the watchdog aborts the communicator and fails the work, but leaves
# the process alive (torch's default tears survivors down).
_NCCL_ERROR_HANDLING = "2"


class InternalError(RuntimeError):
    """Raise it in training code to roll every worker back to the last commit and form a new group.

    The counterpart of Horovod's ``HorovodInternalError`` (also importable under that name); collective
    failures raised by ``torch.distributed`` are treated the same way.
    """

    __module__ = "elastrain.executor.elastic"  # its public name in tracebacks and reprs


class WorkerRemoved(BaseException):
    """This worker is not part of the next world: it stops, and its result is not reported.

    A ``BaseException``, so that a user's ``except Exception`` around a commit cannot swallow it.
    """


def is_collective_failure(error: BaseException) -> bool:
    # An error of torch.distributed's can only come from a process that imported it: never import it here
    # (seconds of import, on the failure path of a process that has no group yet).
    dist = sys.modules.get("torch.distributed")
    if dist is not None and isinstance(error, getattr(dist, "DistError", ())):
        return True
    if isinstance(error, InternalError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(marker in text for marker in _COLLECTIVE_FAILURE_MARKERS)


class Runtime:
    """The elastic machinery of one worker process: its world, its process group and its heartbeat."""

    # What forms each world's process group; the scale harness (benchmarks/scale) puts a stand-in here to run
    # many simulated workers through this same protocol in one process.
    process_group_class: Callable[[int, int, int], ProcessGroup] = ProcessGroup

    def __init__(self, coordinator: Any, worker_id: str, options: ElasticOptions) -> None:
        self.coordinator = coordinator
        self.worker_id = worker_id
        self.options = options
        self.world: World | None = None
        self.member: Member | None = None
        self._group: ProcessGroup | None = None
        self._heartbeat: Heartbeat | None = None
        self._watch: WorldWatch | None = None
        self.resets = 0
        self.role = "newcomer"  # what the fault points see (faults.py); set by the state at each reset
        self.commits = 0  # commits this worker's state holds, told to the rendezvous actor (arrival, heartbeat)
        self.high_water = 0  # the most commits the job reached, as the rendezvous actor knew at the last arrival
        # Objects bound to the current process group (elastic DistributedDataParallel): re-bound to every new
        # group, and released before a group is left so the old group really closes.
        self._group_users: weakref.WeakSet[Any] = weakref.WeakSet()

    def start(self) -> Runtime:
        """Start beating and set the collective backends' environment (before any group exists)."""
        _set_backend_environment(self.options)
        self._heartbeat = Heartbeat(
            self.coordinator,
            self.worker_id,
            self.options.liveness_timeout_s,
            lambda: self.commits,
            lambda: 1 if self.world is None else self.world.size,
        ).start()
        self._watch = WorldWatch(self.coordinator, lambda: self.generation).start()
        watch_raylet()
        return self

    def add_group_user(self, user: Any) -> None:
        """``user.bind()`` runs after each new group forms; ``user.unbind()`` before the group is left."""
        self._group_users.add(user)

    def ensure_joined(self) -> None:
        """Join the first world now (``init_process_group()`` before ``@elastic.run``, as after ``hvd.init()``)."""
        if self.world is None:
            self.join_next_world()

    @property
    def generation(self) -> int:
        return 0 if self.world is None else self.world.generation

    def join_next_world(self) -> None:
        """Wait for the next world that includes this worker, then form its process group. Raises WorkerRemoved
        when a world leaves it out without holding it for a later one."""
        while True:
            packed: PackedWorld = self._wait_on_driver(
                functools.partial(self.coordinator.join.remote, self.worker_id, self.generation), "its next group"
            )
            world = packed.unpack()
            member = world.member(self.worker_id)
            self._leave_group()
            self.world, self.member = world, member
            if member is None and self.worker_id in world.held:
                # Left out until its group of ``size_multiple`` is whole again: it keeps its process and waits.
                logger.info(
                    "Worker %s waits outside group %s for a group with room for it.", self.worker_id, world.generation
                )
                continue
            if member is None:
                raise WorkerRemoved
            fault_point("join")
            try:
                self._form_group(world, member)
                return
            except Exception as error:
                # A member died or was evicted while the group formed: the driver publishes a newer group.
                if not (is_collective_failure(error) or isinstance(error, TimeoutError)):
                    raise

    def _wait_on_driver(self, call: Callable[[float], Any], what: str, whole: bool = False) -> Any:
        """Repeat a chunked wait on the rendezvous actor until it yields a value, while the driver's lease holds;
        that value, or with ``whole`` the answer that carried it."""
        import ray

        lease = self.options.driver_lease_s
        while True:
            try:
                result = ray.get(call(_WAIT_CHUNK_S), timeout=_WAIT_CHUNK_S + lease)
            except ray.exceptions.GetTimeoutError:
                raise TimeoutError(
                    f"Worker {self.worker_id} waited for {what}, but the job's rendezvous actor did not answer for "
                    f"{_WAIT_CHUNK_S + lease:.0f} s."
                ) from None
            if result.value is not None:
                return result if whole else result.value
            if result.driver_silent_s > lease:
                raise TimeoutError(
                    f"Worker {self.worker_id} waited for {what}, but the job's driver has not polled for "
                    f"{result.driver_silent_s:.0f} s (driver_lease_s={lease:g}); is it still running?"
                )

    def _form_group(self, world: World, member: Member) -> None:
        generation = world.generation
        arrival = functools.partial(self.coordinator.arrive.remote, generation, self.worker_id, commits=self.commits)
        arrived = self._wait_on_driver(arrival, f"every member of group {generation} to arrive", whole=True)
        if not arrived.value:
            raise TimeoutError(f"Group {generation} was replaced before every member arrived.")
        self.high_water = max(self.high_water, arrived.high_water)
        fault_point("pg_init")
        self._group = self.process_group_class(generation, member.slot.rank, world.size)
        master = self._group.form(
            self.coordinator,
            self.options.backend or _default_backend(),
            self.options.formation_timeout_s,
            self.options.collective_timeout_s,
        )
        self._publish_context(world, member, master)
        for user in list(self._group_users):
            user.bind()

    def _publish_context(self, world: World, member: Member, master: tuple[str, int]) -> None:
        slot = member.slot
        os.environ.update(
            {
                "MASTER_ADDR": master[0],
                "MASTER_PORT": str(master[1]),
                "RANK": str(slot.rank),
                "WORLD_SIZE": str(world.size),
                "LOCAL_RANK": str(slot.local_rank),
                "LOCAL_WORLD_SIZE": str(slot.local_size),
                "GROUP_RANK": str(member.node_rank),
                "GROUP_WORLD_SIZE": str(member.num_nodes),
                "TORCHELASTIC_RESTART_COUNT": str(self.resets),
            }
        )
        if _WorkerState.context is not None:
            _WorkerState.context = dataclasses.replace(
                _WorkerState.context,
                rank=slot.rank,
                size=world.size,
                local_rank=slot.local_rank,
                local_size=slot.local_size,
                cross_rank=slot.cross_rank,
                cross_size=slot.cross_size,
                node_rank=member.node_rank,
                num_nodes=member.num_nodes,
            )

    def _leave_group(self) -> None:
        for user in list(self._group_users):
            user.unbind()
        if self._group is not None:
            self._group.close()
            self._group = None
        else:  # a group the job formed some other way (tests, benchmarks) is left the same way
            close_default_group()

    def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()
        if self._watch is not None:
            self._watch.stop()
        self._leave_group()

    def pending_update(self) -> int:
        """What every worker agrees is waiting (one small collective): 0 nothing, 1 a world that only lost
        members, 2 a world with newcomers (Horovod's removed/added flags; a mix counts as added)."""
        import torch
        import torch.distributed as dist

        flag = torch.tensor([self.published_update()], dtype=torch.int32, device=collective_device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

    def published_update(self) -> int:
        """What this worker alone sees waiting: 0, 1 or 2 as :meth:`pending_update` agrees on them."""
        import ray

        if self._watch is not None and not self._watch.newer_than(self.generation):
            return 0  # most commits: nothing new, and no call
        members = ray.get(self.coordinator.newer_world.remote(self.generation), timeout=CONTROL_TIMEOUT_S)
        if members is None:
            return 0
        current = {m.worker_id for m in self.world.members} if self.world else set()
        return 1 if set(members) <= current else 2

    def update_published(self) -> bool:
        """Whether the driver has published a world newer than this worker's."""
        import ray

        return ray.get(self.coordinator.newer_world.remote(self.generation), timeout=CONTROL_TIMEOUT_S) is not None

    def hold(self, commits: int) -> None:
        """The state now holds ``commits`` commits, told to the rendezvous actor with the next beat or arrival.

        The job's first commit is told at once and acknowledged before ``commit()`` returns (one round trip, once
        per worker): until the rendezvous actor knows the job committed, losing every holder of the state within a
        beat of that commit would look like a fresh start, not lost state.
        """
        first = commits > 0 and self.commits == 0 and self.high_water == 0
        self.commits = commits
        if not first or self.coordinator is None:
            return
        import ray

        try:
            ray.get(self.coordinator.beat.remote(self.worker_id, commits), timeout=CONTROL_TIMEOUT_S)
        except (ray.exceptions.RayError, TimeoutError) as error:  # the heartbeat tells it later
            logger.warning("Could not tell the rendezvous actor of the job's first commit: %s", first_line(error))

    def plan_reset(self, commits: int, skip_sync: bool, at_commit: bool, persists: bool) -> ResetPlan:
        """This member's plan for the reset of its world, from one all-reduce over every member."""
        rank, counts = gather_counts(commits, skip_sync, at_commit, persists, self.high_water)
        return plan_reset(counts, rank, self.generation, commits, at_commit, self.start_over_on_state_loss)

    @property
    def start_over_on_state_loss(self) -> bool:
        return bool(getattr(self.options, "start_over_on_state_loss", False))  # tests run without options

    def state_started_over(self) -> None:
        """The job's state starts over from zero commits: so does its high-water mark."""
        self.high_water = self.commits = 0
        if self.coordinator is not None:
            self.coordinator.restart_high_water.remote()

    def report_event(self, kind: str, fields: dict[str, Any]) -> None:
        """An event of the run for the driver to hand to its observers (fire and forget)."""
        if self.coordinator is not None:
            self.coordinator.report_event.remote(self.worker_id, kind, fields)

    def report_failure(self, error: BaseException) -> None:
        """Tell the driver this group failed, so it forms a new one even when no worker died."""
        self.coordinator.report_failure.remote(self.worker_id, self.generation, first_line(error))


def _default_backend() -> str:
    import torch

    return "nccl" if _WorkerState.context and _WorkerState.context.gpu_ids and torch.cuda.is_available() else "gloo"


def _set_backend_environment(options: ElasticOptions) -> None:
    if options.nics:
        interfaces = ",".join(sorted(options.nics))
        os.environ["GLOO_SOCKET_IFNAME"] = interfaces
        os.environ["NCCL_SOCKET_IFNAME"] = interfaces
    handling = os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", _NCCL_ERROR_HANDLING)
    if handling not in (_NCCL_ERROR_HANDLING, "0"):
        logger.warning(
            "TORCH_NCCL_ASYNC_ERROR_HANDLING=%s tears a worker down when a peer fails; elastic jobs need it at %s "
            "(clean up only) for survivors to go on.",
            handling,
            _NCCL_ERROR_HANDLING,
        )
