"""The worker side of an elastic job: join worlds, form a fresh process group per world, recover in place."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import logging
import os
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from elastrain.executor._private.context import _WorkerState
from elastrain.executor._private.elastic.collectives import collective_device
from elastrain.executor._private.elastic.world import Member, World

if TYPE_CHECKING:
    from elastrain.executor._private.elastic.state import State

T = TypeVar("T")
logger = logging.getLogger("elastrain.executor")

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


class HostsUpdatedInterrupt(Exception):
    """Raised on every worker at a commit when the driver has a new world for them (hosts added or removed).

    Nothing is rolled back. ``skip_sync`` is True when the new world only lost members: every member then holds
    the same state already, and only what depends on the world (a sampler's split) is synced.
    """

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__(f"hosts updated (skip_sync={skip_sync})")
        self.skip_sync = skip_sync


class InternalError(RuntimeError):
    """Raise it in training code to roll every worker back to the last commit and form a new group.

    The counterpart of Horovod's ``HorovodInternalError`` (also importable under that name); collective
    failures raised by ``torch.distributed`` are treated the same way.
    """


class WorkerRemoved(BaseException):
    """This worker is not part of the next world: it stops, and its result is not reported.

    A ``BaseException``, so that a user's ``except Exception`` around a commit cannot swallow it.
    """


@dataclasses.dataclass
class ElasticOptions:
    rendezvous_timeout_s: float  # how long a worker waits for its next group (a margin beyond elastic_timeout)
    formation_timeout_s: float  # how long forming a group may take once published (timeout_s)
    collective_timeout_s: float
    backend: str | None  # None: gloo on CPU, nccl with GPUs


class Runtime:
    """The elastic machinery of one worker process."""

    def __init__(self, coordinator: Any, worker_id: str, options: ElasticOptions) -> None:
        self.coordinator = coordinator
        self.worker_id = worker_id
        self.options = options
        self.world: World | None = None
        self.member: Member | None = None
        self._store: Any = None
        self.resets = 0
        # Objects bound to the current process group (elastic DistributedDataParallel): re-bound to every new
        # group, and released before a group is left so the old group really closes.
        self._group_users: weakref.WeakSet[Any] = weakref.WeakSet()

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
        """Wait for the next world, then form its process group. Raises WorkerRemoved when left out of it."""
        import ray

        deadline = time.monotonic() + self.options.rendezvous_timeout_s
        world = None
        while world is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"Worker {self.worker_id} waited {self.options.rendezvous_timeout_s} s for the next group "
                    "without one forming (elastic_timeout and a margin; is the job's driver still running?)."
                )
            world = ray.get(self.coordinator.join.remote(self.worker_id, self.generation, min(remaining, 5.0)))
        member = world.member(self.worker_id)
        self._leave_group()
        self.world, self.member = world, member
        if member is None:
            raise WorkerRemoved
        try:
            self._form_group(world, member)
        except Exception as error:
            # A member died while the group formed: the driver publishes a newer group; wait for that one.
            if not (is_collective_failure(error) or isinstance(error, TimeoutError)):
                raise
            self.join_next_world()

    def _form_group(self, world: World, member: Member) -> None:
        import ray
        import torch.distributed as dist

        # Survivors arrive at their next commit, which may take a while: wait as long as for a next group.
        arrived = ray.get(
            self.coordinator.arrive.remote(world.generation, self.worker_id, self.options.rendezvous_timeout_s)
        )
        if not arrived:
            raise TimeoutError(f"Group {world.generation} was replaced before every member arrived.")
        timeout = datetime.timedelta(seconds=self.options.formation_timeout_s)
        rank, size = member.slot.rank, world.size
        node_ip = ray.util.get_node_ip_address()
        if rank == 0:
            self._store = dist.TCPStore(  # type: ignore[attr-defined]
                node_ip, 0, size, is_master=True, wait_for_workers=False, timeout=timeout
            )
            ray.get(self.coordinator.set_store.remote(world.generation, node_ip, self._store.port))
            master = (node_ip, self._store.port)
        else:
            found = ray.get(self.coordinator.get_store.remote(world.generation, self.options.formation_timeout_s))
            if found is None:
                raise TimeoutError(f"Rank 0 of group {world.generation} never published its store.")
            master = found
            self._store = dist.TCPStore(  # type: ignore[attr-defined]
                master[0], master[1], size, is_master=False, timeout=timeout
            )
        backend = self.options.backend or _default_backend()
        dist.init_process_group(
            backend,
            store=self._store,
            rank=rank,
            world_size=size,
            timeout=datetime.timedelta(seconds=self.options.collective_timeout_s),
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
        import torch.distributed as dist

        for user in list(self._group_users):
            user.unbind()
        if dist.is_initialized():
            # A group whose peers died may not shut down cleanly; it is dropped either way.
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        self._store = None

    def close(self) -> None:
        self._leave_group()

    def pending_update(self) -> int:
        """What every worker agrees is waiting (one small collective): 0 nothing, 1 a world that only lost
        members, 2 a world with newcomers (Horovod's removed/added flags; a mix counts as added)."""
        import ray
        import torch
        import torch.distributed as dist

        members = ray.get(self.coordinator.newer_world.remote(self.generation))
        mine = 0
        if members is not None:
            current = {m.worker_id for m in self.world.members} if self.world else set()
            mine = 1 if set(members) <= current else 2
        flag = torch.tensor([mine], dtype=torch.int32, device=collective_device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())

    def update_published(self) -> bool:
        """Whether the driver has published a world newer than this worker's."""
        import ray

        return ray.get(self.coordinator.newer_world.remote(self.generation)) is not None

    def commit_counts(self, commits: int, skip_sync: bool = False) -> tuple[int, int, bool]:
        """The rank whose state is newest (most commits; the lowest such rank), its count, and whether the full
        sync may be skipped: every rank asked to skip it and holds that count.

        Decided by the workers themselves, so a newcomer, or a worker that was published into a group but never
        received state, can never overwrite a survivor's progress; and a worker that rolled back (its peers'
        interrupt reached it as a failed collective) never keeps its older state beside theirs.
        """
        import torch
        import torch.distributed as dist

        size = dist.get_world_size()
        counts = torch.zeros(size + 1, dtype=torch.int64, device=collective_device())
        counts[dist.get_rank()] = commits
        counts[size] = int(skip_sync)
        dist.all_reduce(counts)
        best = int(counts[:size].max().item())
        skip = int(counts[:size].min().item()) == best and int(counts[size].item()) == size
        return int((counts[:size] == best).nonzero()[0].item()), best, skip

    def report_failure(self, error: BaseException) -> None:
        """Tell the driver this group failed, so it forms a new one even when no worker died."""
        self.coordinator.report_failure.remote(self.worker_id, self.generation, _first_line(error))


_current: Runtime | None = None


def install(runtime: Runtime | None) -> None:
    global _current
    _current = runtime


def current() -> Runtime:
    if _current is None:
        raise RuntimeError(
            "elastic.run and elastic state only work inside an elastic RayExecutor job "
            "(RayExecutor(settings, min_workers=...))."
        )
    return _current


def current_or_none() -> Runtime | None:
    return _current


def check_host_updates() -> None:
    update = current().pending_update()
    if update:
        raise HostsUpdatedInterrupt(skip_sync=update == 1)


def commit_counts(commits: int, skip_sync: bool = False) -> tuple[int, int, bool]:
    return current().commit_counts(commits, skip_sync)


def rank() -> int:
    """This worker's rank in its current group; -1 before it joined one."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else -1


def is_collective_failure(error: BaseException) -> bool:
    try:
        import torch.distributed as dist

        if isinstance(error, dist.DistError):
            return True
    except ImportError:  # pragma: no cover - elastic jobs need torch
        pass
    if isinstance(error, InternalError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(marker in text for marker in _COLLECTIVE_FAILURE_MARKERS)


def run(func: Callable[..., T]) -> Callable[..., T]:
    """Make ``func(state, *args, **kwargs)`` elastic: it survives peers failing and hosts coming and going.

    On a collective failure (or :class:`InternalError`) the state rolls back to its last commit; on a host update
    it keeps its work. Either way the worker joins the next group, the reset callbacks run, the state is synced
    across the new world, and ``func`` is called again.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> T:
        runtime = current()
        rejoin = runtime.world is None
        skip_sync = False
        while True:
            try:
                if rejoin:
                    runtime.join_next_world()
                    rejoin = False
                if runtime.generation > 1:
                    state.on_reset()  # every member of a reset's world, newcomers too; the sync evens out the rest
                state._synchronize(skip_sync=skip_sync)
                value = func(state, *args, **kwargs)
                _flush_persistence(state)
                return value
            except HostsUpdatedInterrupt as interrupt:
                skip_sync = interrupt.skip_sync
                if not runtime.update_published():
                    # Raised by the training code itself: ask the driver for a new group of the same workers.
                    runtime.report_failure(interrupt)
            except Exception as error:
                if not is_collective_failure(error):
                    raise
                runtime.report_failure(error)
                state.restore()
                skip_sync = False
            runtime.resets += 1
            rejoin = True

    return wrapper


def _flush_persistence(state: State) -> None:
    """Rank 0 waits for the persisted state's upload in flight; a failure there no longer fails the job."""
    persistence = getattr(getattr(state, "_book", None), "persistence", None)
    if persistence is None or rank() != 0:
        return
    try:
        persistence.flush()
    except Exception as error:
        logger.warning("Persisting the final state failed: %s", _first_line(error))


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:500] if text else type(error).__name__


def _default_backend() -> str:
    import torch

    return "nccl" if _WorkerState.context and _WorkerState.context.gpu_ids and torch.cuda.is_available() else "gloo"
