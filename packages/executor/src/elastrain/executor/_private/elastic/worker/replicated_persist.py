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

import copy
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
FORMAT = "elastrain-whole-state/1"  # what a checkpoint's pickled part says it is, checked before it is read


@dataclass(frozen=True)
class TensorRef:
    """Where a tensor of the committed copy went in the checkpoint, and what to allocate to read it back."""

    key: str
    shape: tuple[int, ...]
    dtype: str
    device: str = "cpu"


def flatten(snapshot: Any, commits: int) -> dict[str, Any]:
    """A whole state's committed copy as DCP's state dict: each tensor under its dotted path, and the rest (the
    structure, with a :class:`TensorRef` in each tensor's place) pickled under ``elastrain``. A ``TorchState``'s
    handlers go under their own names (``model.<fqn>``, as DCP names ``{"model": model.state_dict()}``).

    Raises ``ValueError`` where two tensors would get one name (``{"a.b": x, "a": {"b": y}}``): called on the
    training thread, so the commit fails, saying which, rather than a checkpoint losing a tensor."""
    import torch

    tensors: dict[str, Any] = {}

    def walk(value: Any, path: str) -> Any:
        if isinstance(value, torch.Tensor):
            if path in tensors or path == EXTRA_KEY:
                raise ValueError(
                    f"Two tensors of the state would both be saved as {path!r}: rename a key (the checkpoint names "
                    "a nested tensor by its keys joined with '.')."
                )
            tensors[path] = value
            dtype = str(value.dtype).removeprefix("torch.")
            return TensorRef(path, tuple(value.shape), dtype, str(value.device))
        if isinstance(value, dict):
            walked = copy.copy(value)  # the same kind of mapping (OrderedDict, defaultdict with its factory)
            walked.clear()
            walked.update((k, walk(v, f"{path}.{k}")) for k, v in value.items())
            return walked
        if isinstance(value, list | tuple):
            items = [walk(v, f"{path}.{i}") for i, v in enumerate(value)]
            return _same_sequence(value, items)
        return value

    if isinstance(snapshot, dict) and set(snapshot) == {"handlers", "values"}:  # a TorchState's
        walked: Any = {
            "handlers": {name: walk(saved, name) for name, saved in snapshot["handlers"].items()},
            "values": walk(snapshot["values"], f"{EXTRA_KEY}_values"),
        }
    else:  # any other state's snapshot, whole
        walked = walk(snapshot, f"{EXTRA_KEY}_state")
    skeleton = {"format": FORMAT, "snapshot": walked, "commits": commits}
    extra = io.BytesIO(pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL))
    return {**tensors, EXTRA_KEY: extra}


def _same_sequence(original: Any, items: list[Any]) -> Any:
    if isinstance(original, list):
        return items
    if hasattr(original, "_fields"):  # a named tuple
        return type(original)(*items)
    return tuple(items)


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
    if not isinstance(skeleton, dict) or skeleton.get("format") != FORMAT:
        raise ValueError(
            f"The checkpoint in {folder} was not written from a whole state (TorchState, ObjectState): a sharded "
            "state's checkpoint (ShardedTorchState) loads only into a ShardedTorchState. Give each kind of state "
            "its own URI."
        )
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

    collect(skeleton["snapshot"])
    tensors = {ref.key: torch.empty(ref.shape, dtype=getattr(torch, ref.dtype)) for ref in refs}
    if tensors:
        load(tensors)
    devices = {ref.key: ref.device for ref in refs}

    def fill(value: Any) -> Any:
        if isinstance(value, TensorRef):
            tensor = tensors[value.key]
            device = devices[value.key]
            return tensor.to(device) if device != "cpu" and _device_available(device) else tensor
        if isinstance(value, dict):
            filled = copy.copy(value)
            filled.clear()
            filled.update((k, fill(v)) for k, v in value.items())
            return filled
        if isinstance(value, list | tuple):
            return _same_sequence(value, [fill(v) for v in value])
        return value

    return fill(skeleton["snapshot"]), int(skeleton["commits"])


def _device_available(device: str) -> bool:
    import torch

    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError):
        return False
    return True


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
        flat = flatten(state.snapshot(), commits)  # here, not on the writer thread: a bad state fails its commit
        self._persister.submit_pending(Pending(commits, None, lambda _mesh, _placements: flat))

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
