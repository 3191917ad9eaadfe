"""Sharded checkpoints of a sharded state: every rank writes its own part in PyTorch's DCP format.

A commit that persistence asks for hands this rank's committed copy (already in CPU memory) to a thread; training
goes on. The thread runs ``torch.distributed.checkpoint.save`` on a gloo group of its own: DCP's planner gives
each chunk, and each replicated tensor, to one rank, and rank 0 writes the index (``.metadata``). Each rank then
uploads its part through the persistence object (elastrain-durable's ``ShardedStatePersistence``: the store's
clients, fencing and collection), and rank 0 commits the checkpoint once every part is in. Every rank hands over
the same commits in the same order, so the thread's collectives always match; a second commit handed over while
one is still queued waits for it (the only time training waits), never skips it on one rank alone.

The checkpoint's state dict is ``{"model": ..., "optimizer": ..., "elastrain": ...}``: the model's and the
optimizer's are torch's ``get_state_dict`` of the sharded objects, so plain ``dcp.load`` reads them back into a
model of any world size; ``elastrain`` holds the plain values and other objects, pickled.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import pickle
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from elastrain.executor._private.elastic.worker.collectives import all_gather_object, side_group
from elastrain.executor._private.elastic.worker.shard_copies import Copy
from elastrain.executor._private.errors import first_line

logger = logging.getLogger("elastrain.executor")

_REQUIRED = ("begin", "upload_part", "commit", "latest", "download", "due")


def check_sharded_persistence(persistence: Any) -> None:
    missing = [m for m in _REQUIRED if not callable(getattr(persistence, m, None))]
    if not getattr(persistence, "sharded", False) or missing:
        raise TypeError(
            f"A ShardedTorchState persists with a sharded persistence (every rank writes its part), like "
            f"elastrain.durable.ShardedStatePersistence(uri); {persistence!r} is not one"
            + (f" (it lacks {', '.join(missing)})." if missing else ".")
        )


@dataclass(frozen=True)
class Pending:
    """A committed state handed over for a checkpoint: its commit count, the copy's version (kept from reuse while
    it is written; None for a copy nothing reuses), and how to make DCP's state dict of it on the writing thread."""

    commits: int
    version: int | None
    state_dict: Callable[[Any, Mapping[str, Any]], dict[str, Any]]  # (mesh, placements) -> state dict


class _World:
    """One world's checkpoints: its group, and a thread of its own with a queue of one.

    A world's thread is never shared with the next world's: one still blocked in a collective of a failed world
    (until its peers' groups close) holds up nothing of the next.
    """

    def __init__(self, rank: int, size: int, group: Any, mesh: Any, placements: Mapping[str, Any]) -> None:
        self.rank, self.size, self.group, self.mesh, self.placements = rank, size, group, mesh, placements
        self.ended = False
        self.queued: Pending | None = None
        self.running: Pending | None = None
        self.thread: threading.Thread | None = None


class ShardPersister:
    """One rank's side of the sharded checkpoints, across worlds."""

    def __init__(self, persistence: Any) -> None:
        self.persistence = persistence
        self._world: _World | None = None
        self._cond = threading.Condition()
        self.last_error = ""  # the last failure's message (not the exception: its frames would hold the group)
        self.committed: list[str] = []  # checkpoints this rank wrote a part of

    def start_world(self, rank: int, size: int, mesh: Any, placements: Mapping[str, Any]) -> None:
        """Every member calls it after the sync (a collective: the group of this world's checkpoints)."""

        group = side_group()
        with self._cond:
            self._world = _World(rank, size, group, mesh, placements)

    def end_world(self) -> None:
        """The world ends: a checkpoint of it still queued is dropped; one being written fails with its group."""
        with self._cond:
            world, self._world = self._world, None
            if world is not None:
                world.ended = True
                if world.queued is not None:
                    logger.info("Dropped the queued checkpoint of commit %d: its world ended.", world.queued.commits)
                world.queued = None
                world.group = world.mesh = None  # the thread holds what it needs; the world lets go of the rest
            self._cond.notify_all()

    def pinned_versions(self) -> set[int]:
        with self._cond:
            world = self._world
            if world is None:
                return set()
            return {p.version for p in (world.queued, world.running) if p is not None and p.version is not None}

    @property
    def has_world(self) -> bool:
        with self._cond:
            return self._world is not None

    def submit(self, copy: Copy) -> None:
        """Hand over a sharded state's committed copy; waits only while another of this world is still queued."""
        self.submit_pending(Pending(copy.commits, copy.version, functools.partial(_dcp_state_dict, copy)))

    def submit_pending(self, copy: Pending) -> None:
        """Hand over a committed state; waits only while another of this world is still queued."""
        with self._cond:
            world = self._world
            if world is None:
                return
            self._cond.wait_for(lambda: world.queued is None or world.ended)
            if world.ended:
                return
            world.queued = copy
            if world.thread is None:
                world.thread = threading.Thread(
                    target=self._work,
                    args=(world, world.group, world.mesh),
                    name="elastrain-sharded-persist",
                    daemon=True,
                )
                world.thread.start()
            self._cond.notify_all()

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until what this world handed over is committed (or failed)."""
        with self._cond:
            world = self._world
            done = world is None or self._cond.wait_for(
                lambda: world.queued is None and world.running is None, timeout_s
            )
        if not done:
            raise TimeoutError(f"Persisting the sharded state is still running after {timeout_s} s.")

    def _work(self, world: _World, group: Any, mesh: Any) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: world.queued is not None or world.ended)
                if world.queued is None:
                    return
                copy, world.queued = world.queued, None
                world.running = copy
                self._cond.notify_all()
            try:
                self._write(copy, world, group, mesh)
                self.last_error = ""
            except Exception as error:  # reported; training goes on, and the next due commit tries again
                self.last_error = first_line(error)
                level = logging.INFO if world.ended else logging.WARNING
                logger.log(level, "Persisting the sharded state (commit %d) failed: %s", copy.commits, self.last_error)
                del error
            finally:
                with self._cond:
                    world.running = None
                    self._cond.notify_all()

    def _write(self, copy: Pending, world: _World, group: Any, mesh: Any) -> None:
        from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

        persistence = self.persistence
        name = None
        if world.rank == 0:
            try:
                name = persistence.begin(copy.commits)
            except Exception as error:  # every rank must learn it: they are about to meet in a collective
                logger.warning("Could not open a checkpoint of commit %d: %s", copy.commits, first_line(error))
        name = all_gather_object(name, group=group)[0]
        if name is None:
            return
        scratch = tempfile.mkdtemp(prefix="elastrain-dcp-")
        try:
            part = f"part-{world.rank:05d}"
            os.makedirs(os.path.join(scratch, part))
            state_dict = copy.state_dict(mesh, world.placements)
            dcp_save(state_dict, storage_writer=_PartWriter(scratch), process_group=group)
            entries: list[dict[str, Any]] | None
            try:
                entries = persistence.upload_part(name, part, os.path.join(scratch, part))
            except Exception as error:
                logger.warning("Uploading part %s of commit %d failed: %s", part, copy.commits, first_line(error))
                entries = None
            parts = all_gather_object(entries, group=group)
            if world.rank == 0:
                if any(p is None for p in parts):
                    raise RuntimeError(f"{sum(p is None for p in parts)} part(s) of commit {copy.commits} failed")
                with open(os.path.join(scratch, ".metadata"), "rb") as reader:
                    metadata = reader.read()
                persistence.commit(
                    name,
                    parts,
                    step=copy.commits,
                    metrics={"world_size": world.size},
                    index_files={".metadata": metadata},
                )
            self.committed.append(name)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def _dcp_state_dict(copy: Copy, mesh: Any, placements: Mapping[str, Any]) -> dict[str, Any]:
    """The committed copy as the state dict DCP saves: chunks as DTensors on the world's mesh (no data moves)."""
    import torch
    from torch.distributed.tensor import DTensor

    model: dict[str, Any] = {}
    optimizer_state: dict[str, dict[str, Any]] = {}

    def place(key: str, value: Any) -> None:
        kind, _, rest = key.partition("/")
        if kind == "model":
            model[rest] = value
        else:
            fqn, _, name = rest.rpartition("/")
            optimizer_state.setdefault(fqn, {})[name] = value

    for key, view in copy.views.items():
        slot = copy.layout.slots[key]
        shape = slot.info.global_shape
        stride = tuple(_contiguous_strides(shape))
        tensor = DTensor.from_local(view, mesh, placements[key], shape=torch.Size(shape), stride=stride)
        place(key, tensor)
    replicated = dict(copy.replicated or {})
    live = dict(replicated.get("live", {}))
    for key, value in live.get("plain", {}).items():
        place(key, value)
    state: dict[str, Any] = {"model": model}
    if live.get("param_groups") is not None:
        state["optimizer"] = {"state": optimizer_state, "param_groups": live["param_groups"]}
    extra = {
        "values": replicated.get("values", {}),
        "handlers": replicated.get("handlers", {}),
        "others": live.get("others", {}),
        "optimizer_has_state": live.get("optimizer_has_state", False),
        "param_groups": live.get("param_groups"),
        "commits": copy.commits,
    }
    state["elastrain"] = io.BytesIO(pickle.dumps(extra, protocol=pickle.HIGHEST_PROTOCOL))
    return state


def _contiguous_strides(shape: tuple[int, ...]) -> list[int]:
    strides, running = [], 1
    for extent in reversed(shape):
        strides.append(running)
        running *= max(extent, 1)
    return list(reversed(strides))


def _part_writer_class() -> Any:
    from torch.distributed.checkpoint.filesystem import FileSystemWriter, _StoragePrefix

    class PartWriter(FileSystemWriter):
        """DCP's file writer, with each rank's files in a folder of its own (``part-00003/__3_0.distcp``), so
        that every rank uploads one folder and the index still names every file by its path."""

        def prepare_global_plan(self, plans: list[Any]) -> list[Any]:
            import dataclasses

            return [
                dataclasses.replace(plan, storage_data=_StoragePrefix(f"part-{i:05d}/__{i}_"))
                for i, plan in enumerate(plans)
            ]

    return PartWriter


def _PartWriter(path: str) -> Any:  # a class, built on first use (imports torch's DCP)
    return _part_writer_class()(path, single_file_per_rank=True, sync_files=True)
