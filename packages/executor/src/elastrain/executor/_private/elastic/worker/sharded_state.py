"""``elastic.ShardedTorchState``: an FSDP2-sharded model and its optimizer as elastic state.

No worker holds the whole state, so a reset cannot copy it from one source. Instead every member keeps its own
committed chunks in CPU memory (and, with redundancy, a copy of its ward's: ``shard_buddy.py``). At a reset the
members rebuild the model on the new world's mesh with the user's ``build(mesh)``, say which chunks they hold
and which the new layout gives them, and derive one plan (``shard_plan.py``): the newest version whose every
chunk is still held, and who sends each piece. The pieces move point to point (``shard_transfer.py``) and load
into the new model and optimizer. Survivors keep running; only newcomers start.
"""

from __future__ import annotations

import copy
import inspect
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from elastrain.executor._private.elastic.worker import runtime
from elastrain.executor._private.elastic.worker.collectives import all_gather_object, broadcast_object
from elastrain.executor._private.elastic.worker.faults import fault_point
from elastrain.executor._private.elastic.worker.handlers import StateHandler, handler_for
from elastrain.executor._private.elastic.worker.reset import ResetPlan, StateLoss, SyncRole
from elastrain.executor._private.elastic.worker.shard_buddy import Redundancy
from elastrain.executor._private.elastic.worker.shard_copies import Copy, Layout, chunk_tensor, merged_holdings
from elastrain.executor._private.elastic.worker.shard_persist import ShardPersister, check_sharded_persistence
from elastrain.executor._private.elastic.worker.shard_plan import ShardPlan, plan_shards
from elastrain.executor._private.elastic.worker.shard_transfer import move_pieces
from elastrain.executor._private.elastic.worker.sharded_live import (
    LiveShards,
    MeshShape,
    build_objects,
    forget_cached_meshes,
    hsdp_arrangement,
    mesh_place,
    release_mesh,
)
from elastrain.executor._private.elastic.worker.state import State, _check_names
from elastrain.executor._private.elastic.worker.state_loss import state_lost_error
from elastrain.executor._private.errors import first_line

logger = logging.getLogger("elastrain.executor")


@dataclass
class _Shards:
    build: Callable[[Any], Any]
    redundancy: Redundancy
    mesh_shape: MeshShape | None = None
    built: dict[str, Any] = field(default_factory=dict)  # what build() returned, by name
    mesh: Any = None  # the current world's mesh
    live: LiveShards | None = None
    own: list[Copy] = field(default_factory=list)  # this rank's own copies, oldest first
    version: int = 0  # the number of the last save
    handlers: dict[str, StateHandler] = field(default_factory=dict)  # samplers, schedulers: replicated
    last_load: dict[str, Any] = field(default_factory=dict)  # what the last reset did (also reported as an event)
    persister: ShardPersister | None = None
    place: tuple[int, int, int] | None = None  # (shard size, row, column) on the current HSDP mesh


class ShardedTorchState(State):
    """A sharded model and optimizer, rebuilt on every new world: ``ShardedTorchState(build, epoch=0)``.

    ``build(mesh)`` runs on every member at every reset with a ``DeviceMesh`` over the new world (1-D, or with
    ``mesh_shape=lambda size: (replicas, shard_size)`` a 2-D ``("replicate", "shard")`` mesh, which
    ``fully_shard`` takes as HSDP: each replica group shards the model, and the groups replicate it), and returns
    the model it sharded there (``fully_shard``), or ``(model, optimizer)``, or a dict of named objects (one
    module, at most one optimizer, and schedulers built on it). Read them inside the training function
    (``state.model``, ``state.optimizer``): each reset builds new ones, loaded with the committed state.

    ``commit()`` copies this rank's chunks to CPU memory; with ``redundancy_every=n`` (default 1) every n-th
    commit also sends them to a buddy rank in the background. A reset loads the newest version whose every chunk
    a member still holds (its owner's or its buddy's copy), resharded onto the new world; when no version is
    whole the state counts as lost (see ``elastic.run``). Keyword values are plain values, or ``ElasticSampler``,
    LR schedulers and objects with ``state_dict()``, kept identical on every rank.
    """

    def __init__(
        self,
        build: Callable[[Any], Any],
        *,
        mesh_shape: MeshShape | None = None,
        redundancy_every: int = 1,
        **values: Any,
    ) -> None:
        if not callable(build):
            raise TypeError(
                f"ShardedTorchState takes build(mesh), a function that builds and shards the model on a mesh, got "
                f"{build!r}."
            )
        if mesh_shape is not None and not callable(mesh_shape):
            raise TypeError(
                "mesh_shape is a function of the world size that returns (replicas, shard_size), e.g. "
                f"`lambda n: (n // 2, 2) if n % 2 == 0 else (1, n)`; got {mesh_shape!r}."
            )
        if not isinstance(redundancy_every, int) or isinstance(redundancy_every, bool) or redundancy_every < 0:
            raise ValueError(
                "redundancy_every must be a whole number >= 0 (0 turns in-memory copies off), got "
                f"{redundancy_every!r}."
            )
        _import_before_groups()
        State.__init__(self)
        shards = _Shards(build, Redundancy(redundancy_every), mesh_shape)
        self.__dict__["_shards"] = shards
        plain: dict[str, Any] = {}
        for name, value in values.items():
            _refuse_sharded_value(name, value)
            handler = handler_for(value) if value is not None else None
            if handler is None:
                plain[name] = value
            else:
                shards.handlers[name] = handler(value)
        _check_names(type(self), [*plain, *shards.handlers])
        self._book.value_names.extend(plain)
        for name, value in plain.items():
            object.__setattr__(self, name, value)
        job = runtime.current_or_none()
        if job is not None:
            job.add_group_user(self)

    @property
    def _shards(self) -> _Shards:
        shards: _Shards = self.__dict__["_shards"]
        return shards

    def __getattr__(self, name: str) -> Any:
        shards = self.__dict__.get("_shards")
        if shards is not None:
            if name in shards.handlers:
                return shards.handlers[name].value
            if name in shards.built:
                return shards.built[name]
            if name in ("model", "optimizer") and not shards.built:
                raise AttributeError(
                    f"ShardedTorchState.{name} is built at each reset, on the new world's mesh: read it inside the "
                    "function decorated with @elastic.run."
                )
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    @property
    def last_load(self) -> dict[str, Any]:
        """What the last reset did: ``path`` (``"memory"``, ``"fresh"``, ``"start_over"``), the version and
        commits it loaded, the commits it lost, and the bytes this rank copied locally, sent and received."""
        return dict(self._shards.last_load)

    # -- group changes (the runtime calls these around each world) --------------------------------------------

    def bind(self) -> None:
        """A new group formed: the state is rebuilt on it by the sync that follows."""

    def unbind(self) -> None:
        """The world ends: keep the copies that arrived whole, drop the objects bound to its mesh."""
        import gc

        shards = self._shards
        shards.redundancy.freeze()
        if shards.persister is not None:
            shards.persister.end_world()
        shards.live = None
        shards.built = {}
        if shards.mesh is not None:
            release_mesh(shards.mesh)
            shards.mesh = None
        # FSDP's modules and hooks refer to each other, so only the cycle collector frees them, and with them the
        # old mesh's hold on the group: until then its connections stay open, and a peer still waiting in a
        # collective on this rank waits out the whole timeout instead of failing at once.
        gc.collect()

    # -- commits ----------------------------------------------------------------------------------------------

    def commit(self) -> None:
        shards = self._shards
        commits = self._book.commits + 1
        due = shards.redundancy.due(commits)
        shards.redundancy.before_save()
        own = self._save_copy(commits)
        shards.redundancy.after_save(own, due)
        persister = shards.persister
        if persister is not None and persister.persistence.due(commits):
            fault_point("persist_handoff")
            persister.submit(own)
        self._book.commits = commits
        runtime.held_commits(commits)
        try:
            self.check_host_updates()
        except runtime.HostsUpdatedInterrupt as interrupt:
            self._book.commit_interrupt = interrupt
            raise

    def save(self) -> None:
        self._save_copy(self._book.commits)

    def _live(self) -> LiveShards:
        live = self._shards.live
        if live is None:
            raise RuntimeError(
                "The sharded state has no model on this world yet: commit() and save() work inside the function "
                "decorated with @elastic.run, after the reset built it."
            )
        return live

    def _save_copy(self, commits: int) -> Copy:
        """Copy the live state into a new version of this rank's own copy, reusing a buffer no longer needed."""
        shards = self._shards
        live = self._live()
        layout = live.layout()
        keep = shards.redundancy.kept_versions()
        if shards.persister is not None:
            keep |= shards.persister.pinned_versions()
        reusable = next((c for c in shards.own if c.version not in keep and c.layout == layout), None)
        buffer = reusable.buffer if reusable is not None else layout.allocate()
        shards.own = [c for c in shards.own if c.version in keep and c is not reusable]
        shards.version += 1
        own = Copy(shards.version, commits, layout, buffer, self._replicated(live), shards.place)
        live.copy_into(own.views)
        fault_point("commit_copy_mid", done=1)
        shards.own.append(own)
        return own

    def _replicated(self, live: LiveShards) -> dict[str, Any]:
        values = {name: getattr(self, name) for name in self._book.value_names}
        return {
            "values": copy.deepcopy(values),
            "handlers": {name: copy.deepcopy(h.value.state_dict()) for name, h in self._shards.handlers.items()},
            "live": live.replicated(),
        }

    def restore(self) -> None:
        """Back to the last commit: the live objects and values from this rank's newest own copy."""
        shards = self._shards
        if not shards.own:
            return
        latest = shards.own[-1]
        self._load_replicated(latest.replicated or {})
        if shards.live is not None:
            shards.live.load_from(latest.views, (latest.replicated or {}).get("live", {}))

    def _roll_back(self) -> None:
        # The sync that follows rebuilds the objects and loads the newest whole version into them.
        self._book.at_commit, self._book.commit_interrupt = True, None

    def _interrupted(self, interrupt: BaseException) -> None:
        # Work after the last commit cannot be kept: a sharded state has no single live copy to send. A host
        # update raised outside commit() resumes from the last commit (commit() raises it right after a save).
        if interrupt is not self._book.commit_interrupt and self._shards.own:
            logger.info("A host update outside commit(): the sharded state resumes from its last commit.")
        self._book.at_commit, self._book.commit_interrupt = True, None

    # -- resets -----------------------------------------------------------------------------------------------

    def _synchronize(self, *, skip_sync: bool = False) -> None:
        import torch.distributed as dist

        book, shards = self._book, self._shards
        role_before = self._pre_sync_role()
        book.at_commit = False
        job = runtime.current()
        rank, size = dist.get_rank(), dist.get_world_size()
        job.role = role_before
        forget_cached_meshes()  # none of an earlier world's meshes may answer for this one's
        arrangement = hsdp_arrangement(shards.mesh_shape, size, shards.own[-1] if shards.own else None)
        shards.mesh, shards.built = build_objects(shards.build, size, shards.mesh_shape, arrangement)
        shards.place = mesh_place(shards.mesh)
        shards.live = live = LiveShards.of(shards.built)
        targets = live.layout(init_optimizer=True)
        held = [*shards.own, *shards.redundancy.ward_copies()]
        node = getattr(getattr(job, "member", None), "node_rank", rank)
        gathered = all_gather_object(
            (merged_holdings(held), targets.describe(), node, job.high_water, self._pre_sync_role())
        )
        plan = plan_shards([g[0] for g in gathered], [{k: v[0] for k, v in g[1].items()} for g in gathered])
        high_water = max(g[3] for g in gathered)
        if plan.version is not None and plan.replicated_source == rank:
            job.role = "source"
        self._load(plan, rank, held, high_water, gathered)
        if job.generation > 1 or plan.version is not None:
            fault_point("reset_callbacks", role=role_before)
            self.on_reset()
        # Every member numbers its next save alike, whatever it held before.
        shards.version = max([plan.version or 0, *(h.version for g in gathered for h in g[0])])
        own = self._save_copy(book.commits)  # the loaded state, in this world's layout: what a rollback restores
        ring = shards.redundancy.every > 0 and size > 1
        layouts = all_gather_object(own.layout.describe()) if ring else []
        shards.redundancy.start_world(rank, size, [g[2] for g in gathered], layouts)
        shards.redundancy.send_now(own)
        if shards.persister is not None:
            shards.persister.start_world(rank, size, shards.mesh, self._live().placements)
        book.synced = True
        runtime.held_commits(book.commits)

    def _load(self, plan: ShardPlan, rank: int, held: list[Copy], high_water: int, gathered: list[Any]) -> None:
        book, shards = self._book, self._shards
        job = runtime.current()
        if plan.version is None and self._load_persisted(rank, high_water):
            return
        if plan.version is None:
            anyone_committed = high_water > 0 or any(h.commits > 0 for g in gathered for h in g[0])
            if anyone_committed:
                reset_plan = ResetPlan(
                    job.generation, rank, 0, 0, False, SyncRole.SOURCE, False, False, high_water, StateLoss.FAIL
                )
                if not job.start_over_on_state_loss:
                    raise state_lost_error(reset_plan, persisted=False)
                logger.warning(
                    "The sharded state's chunks of every version were lost with their holders (%d commits); starting "
                    "over from build(), as start_over_on_state_loss=True asks. %s",
                    high_water,
                    _missing_text(plan),
                )
                job.state_started_over()
                shards.last_load = {"path": "start_over", "lost_commits": high_water}
            else:
                shards.last_load = {"path": "fresh"}
            self._live().forget_optimizer_init()
            book.commits = 0
            shards.last_load.update(generation=job.generation, version=None, commits=0)
            self._report(rank)
            return
        fault_point("sync_before")
        live = self._live()
        moved = move_pieces(
            plan,
            rank,
            lambda key, box: chunk_tensor(held, plan.version or 0, key, box),
            live.targets(),
            piece_done=lambda: fault_point("sync_mid", done=1),
        )
        mine = next((c for c in held if c.version == plan.version and c.replicated is not None), None)
        replicated = broadcast_object(mine.replicated if mine is not None else None, plan.replicated_source)
        live.finish_load(replicated.get("live", {}))
        self._load_replicated(replicated)
        fault_point("sync_after")
        lost = max(high_water - plan.commits, 0)
        if lost:
            logger.warning(
                "The sharded state resumes from %d commits, %d short of the job's %d: a failure took the newest "
                "commit's chunks before their copy reached a buddy.",
                plan.commits,
                lost,
                high_water,
            )
        book.commits = plan.commits
        shards.last_load = {
            "path": "memory",
            "generation": job.generation,
            "version": plan.version,
            "commits": plan.commits,
            "lost_commits": lost,
            "local_bytes": moved.local_bytes,
            "sent_bytes": moved.sent_bytes,
            "received_bytes": moved.received_bytes,
        }
        self._report(rank)

    def _load_persisted(self, rank: int, high_water: int) -> bool:
        """No version is whole in memory: every member loads the latest sharded checkpoint, if there is one."""
        import tempfile

        shards, job = self._shards, runtime.current()
        if shards.persister is None:
            return False
        persistence = shards.persister.persistence
        name = None
        if rank == 0:
            try:
                name = persistence.latest()
            except Exception as error:  # every member must hear it: they meet in the broadcast below
                logger.warning("Could not list the sharded checkpoints: %s", first_line(error))
        name = broadcast_object(name, 0)
        if name is None:
            return False
        with tempfile.TemporaryDirectory(prefix="elastrain-dcp-load-") as scratch:
            folder = os.path.join(scratch, "checkpoint")
            live = self._live()
            if "parts" in inspect.signature(persistence.download).parameters:
                # The index first, then only the parts that hold this rank's new chunks (and the replicated
                # entries): each rank downloads about its share, not the whole checkpoint.
                persistence.download(name, folder, parts=())
                commits = int(persistence.download(name, folder, parts=sorted(live.needed_parts(folder))))
            else:
                commits = int(persistence.download(name, folder))
            kept = live.load_dcp(folder)
        self._load_replicated({"values": kept.get("values", {}), "handlers": kept.get("handlers", {})})
        lost = max(high_water - commits, 0)
        if lost:
            logger.warning(
                "The sharded state was lost from memory at %d commits; resumed from the sharded checkpoint of commit "
                "%d: the %d commits after it are redone.",
                high_water,
                commits,
                lost,
            )
        self._book.commits = commits
        shards.last_load = {
            "path": "persisted",
            "generation": job.generation,
            "version": None,
            "commits": commits,
            "lost_commits": lost,
            "checkpoint": str(name),
        }
        self._report(rank)
        return True

    def _flush_all_ranks(self) -> None:
        """When the training function returns: every rank waits for its part of the checkpoint in flight."""
        persister = self._shards.persister
        if persister is not None:
            persister.flush()

    def _report(self, rank: int) -> None:
        if rank == 0:
            runtime.current().report_event("sharded_state_loaded", dict(self._shards.last_load))

    def _load_replicated(self, replicated: dict[str, Any]) -> None:
        for name, value in copy.deepcopy(replicated.get("values", {})).items():
            object.__setattr__(self, name, value)
        for name, saved in replicated.get("handlers", {}).items():
            self._shards.handlers[name].value.load_state_dict(copy.deepcopy(saved))

    def snapshot(self) -> Any:
        raise TypeError(
            "A ShardedTorchState has no single snapshot: every rank holds part of it. Persist it with a sharded "
            "persistence (every rank writes its part), not a whole-state one."
        )

    def persist_with(self, persistence: Any) -> None:
        """Also write sharded checkpoints, every rank its part: ``elastrain.durable.ShardedStatePersistence(uri)``.

        At every commit it calls due, each rank hands its committed copy to a background thread that writes it in
        PyTorch's DCP format and uploads it; the checkpoint commits once every part is in. When no version is whole
        in memory (a fresh job on the same URI, or a shard lost with its buddy), every member loads the latest
        checkpoint, resharded onto the new world."""
        check_sharded_persistence(persistence)
        self._shards.persister = ShardPersister(persistence)
        self._book.persistence = None  # the runtime's rank-0 hand-off is for whole-state persistence


def _import_before_groups() -> None:
    """Import torch's FSDP before this worker's first group forms.

    Some of its functions take ``dist.group.WORLD`` as a default argument, evaluated at import: imported while a
    group exists, they hold that group for good. A gloo group's connections close only when it is freed, so a
    peer still waiting on this rank in a collective of a failed world would wait out the whole
    ``collective_timeout_s`` instead of failing at once.
    """
    import sys

    import torch.distributed as dist

    late = "torch.distributed.fsdp" not in sys.modules and dist.is_available() and dist.is_initialized()
    import torch.distributed.checkpoint.state_dict
    import torch.distributed.fsdp  # noqa: F401

    if late:
        logger.warning(
            "torch.distributed.fsdp was first imported after the process group formed, so torch holds that group "
            "for good: if a peer fails in this first world, others may wait up to collective_timeout_s. Build the "
            "ShardedTorchState before init_process_group(), or import torch.distributed.fsdp first."
        )


def _missing_text(plan: ShardPlan) -> str:
    if not plan.missing:
        return ""
    shown = ", ".join(f"{key} ({count} elements)" for key, count in sorted(plan.missing.items())[:3])
    return f"Missing from the newest version: {shown}."


def _refuse_sharded_value(name: str, value: Any) -> None:
    import torch

    if isinstance(value, torch.nn.Module | torch.optim.Optimizer):
        raise TypeError(
            f"ShardedTorchState({name}=...) got a {type(value).__name__}: the model and optimizer come from "
            "build(mesh), which runs again on every new world. Build them there and return them."
        )


__all__ = ["Layout", "ShardedTorchState"]
