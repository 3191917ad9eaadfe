"""A whole state (every rank holds all of it, as under DDP) persisted by every rank at once, each writing a part.

``state.persist_with(ShardedStatePersistence(uri))`` on a ``TorchState`` hands every rank's committed copy to a
background thread at each due commit. The thread runs ``torch.distributed.checkpoint.save`` over a gloo group of its
own (``shard_persist.py``): DCP's planner sees every tensor on every rank and gives each to one rank, the rank with
the least to write so far, so each of N ranks uploads about 1/N of the state. The checkpoint commits as a sharded
state's does: one manifest once every part is in.

The checkpoint is a plain DCP folder. Its tensors are named as DCP names a nested state dict's,
``model.<fqn>`` and ``optimizer.state.<id>.exp_avg``, so plain ``dcp.load({"model": model.state_dict()}, ...)``
reads the model back. The rest of the committed copy, with a description of each tensor, is pickled under
``elastrain``; a job that resumes reads every tensor back into that structure, whatever its world size.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from typing import Any

from elastrain.executor._private.elastic.worker import runtime
from elastrain.executor._private.elastic.worker.shard_persist import Pending, ShardPersister, check_sharded_persistence

logger = logging.getLogger("elastrain.executor")

EXTRA_KEY = "elastrain"


@dataclass(frozen=True)
class TensorRef:
    """Where a tensor of the committed copy went in the checkpoint, and what to allocate to read it back."""

    key: str
    shape: tuple[int, ...]
    dtype: str


def flatten(snapshot: Any, commits: int) -> dict[str, Any]:
    """A whole state's committed copy as DCP's state dict: each tensor under its dotted path, and the rest (the
    structure, with a :class:`TensorRef` in each tensor's place) pickled under ``elastrain``."""
    import torch

    tensors: dict[str, Any] = {}

    def walk(value: Any, path: str) -> Any:
        if isinstance(value, torch.Tensor):
            tensors[path] = value
            return TensorRef(path, tuple(value.shape), str(value.dtype).removeprefix("torch."))
        if isinstance(value, dict):
            return {k: walk(v, f"{path}.{k}") for k, v in value.items()}
        if isinstance(value, list | tuple):
            walked = [walk(v, f"{path}.{i}") for i, v in enumerate(value)]
            return walked if isinstance(value, list) else tuple(walked)
        return value

    skeleton = {
        "handlers": {name: walk(saved, name) for name, saved in snapshot.get("handlers", {}).items()},
        "values": walk(snapshot.get("values", {}), f"{EXTRA_KEY}_values"),
        "commits": commits,
    }
    extra = io.BytesIO(pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL))
    return {**tensors, EXTRA_KEY: extra}


def read_back(folder: str) -> tuple[Any, int]:
    """A checkpoint :func:`flatten` wrote, read whole into this process (no group: every rank reads all of it)."""
    import torch
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    def load(state: dict[str, Any]) -> None:
        with warnings.catch_warnings():  # torch notes that no_dist reads in one process: as meant
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp_load(state, storage_reader=FileSystemReader(folder), no_dist=True)

    state: dict[str, Any] = {EXTRA_KEY: io.BytesIO()}
    load(state)  # DCP replaces the entry with the bytes it read
    skeleton = pickle.loads(state[EXTRA_KEY].getvalue())  # noqa: S301 - the job's own checkpoint
    refs: list[TensorRef] = []

    def collect(value: Any) -> None:
        if isinstance(value, TensorRef):
            refs.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                collect(v)
        elif isinstance(value, list | tuple):
            for v in value:
                collect(v)

    collect(skeleton)
    tensors = {ref.key: torch.empty(ref.shape, dtype=getattr(torch, ref.dtype)) for ref in refs}
    if tensors:
        load(tensors)

    def fill(value: Any) -> Any:
        if isinstance(value, TensorRef):
            return tensors[value.key]
        if isinstance(value, dict):
            return {k: fill(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            filled = [fill(v) for v in value]
            return filled if isinstance(value, list) else tuple(filled)
        return value

    snapshot = {"handlers": fill(skeleton["handlers"]), "values": fill(skeleton["values"])}
    return snapshot, int(skeleton["commits"])


class EveryRankPersistence:
    """What ``persist_with`` makes of a sharded persistence for a whole state: every rank writes its share."""

    every_rank = True  # State.commit hands the state over on every rank, not on rank 0 alone

    def __init__(self, persistence: Any) -> None:
        check_sharded_persistence(persistence)
        self.persistence = persistence
        self._persister = ShardPersister(persistence)
        self._registered = False

    def __repr__(self) -> str:
        return repr(self.persistence)

    @property
    def last_error(self) -> str:
        return self._persister.last_error

    def committed(self, state: Any) -> None:
        import torch.distributed as dist

        commits = state.commit_count
        if not self.persistence.due(commits):
            return
        if not self._registered:  # the world's end must end its checkpoints' group too (unbind)
            runtime.current().add_group_user(self)
            self._registered = True
        if not self._persister.has_world:  # every rank reaches its world's first due commit together
            self._persister.start_world(dist.get_rank(), dist.get_world_size(), None, {})
        snapshot = state.snapshot()
        self._persister.submit_pending(Pending(commits, None, lambda _mesh, _placements: flatten(snapshot, commits)))

    def bind(self) -> None:
        """A new world formed: its checkpoints' group forms at its first due commit."""

    def unbind(self) -> None:
        self._persister.end_world()

    def latest(self) -> Any:
        return self.persistence.latest()

    def load(self, name: Any) -> tuple[Any, int]:
        scratch = tempfile.mkdtemp(prefix="elastrain-dcp-load-")
        try:
            folder = os.path.join(scratch, "checkpoint")
            self.persistence.download(name, folder)
            return read_back(folder)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def flush(self, timeout: float | None = None) -> None:
        """Every rank waits for its part of the checkpoint in flight."""
        self._persister.flush(timeout)
