"""The live objects of a sharded state in one world: what ``build(mesh)`` made, seen as chunks.

torch's ``get_state_dict`` names every tensor of the model and its optimizer by the parameter's fully qualified
name, whatever the world; each ``DTensor`` among them is cut into chunks (one per rank, at a global offset), the
rest (optimizer steps, buffers, settings) is the same on every rank. Keys here are ``model/<fqn>`` and
``optimizer/<fqn>/<state>``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from elastrain.executor._private.elastic.worker.collectives import all_gather_object
from elastrain.executor._private.elastic.worker.shard_copies import Copy, Layout
from elastrain.executor._private.elastic.worker.shard_plan import TensorInfo, arrange_mesh

MeshShape = Callable[[int], tuple[int, int]]
MESH_DIM_NAMES = ("replicate", "shard")


def mesh_dims(mesh_shape: MeshShape | None, size: int) -> tuple[tuple[int, ...], tuple[str, ...] | None]:
    """The shape (and dimension names) of the mesh for a world of ``size``: 1-D, or ``mesh_shape``'s 2-D
    (replicate, shard) shape for HSDP, checked to cover the world exactly."""
    if mesh_shape is None:
        return (size,), None
    shape = mesh_shape(size)
    if (
        not isinstance(shape, tuple)
        or len(shape) != 2
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in shape)
        or shape[0] * shape[1] != size
    ):
        raise ValueError(
            f"mesh_shape({size}) must return (replicas, shard_size), two positive ints whose product is the world "
            f"size {size}; it returned {shape!r}. Give a shape for every size the job can have, e.g. "
            "`lambda n: (n // 2, 2) if n % 2 == 0 else (1, n)`."
        )
    return shape, MESH_DIM_NAMES


def build_objects(
    build: Callable[[Any], Any],
    size: int,
    mesh_shape: MeshShape | None = None,
    arrangement: list[list[int]] | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Run ``build`` on a mesh over the current world; the mesh, and what it returned by name. ``arrangement``:
    the ranks of a 2-D mesh row by row (``shard_plan.arrange_mesh``); in rank order without it."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    device_type = "cuda" if dist.get_backend() == "nccl" else "cpu"
    shape, names = mesh_dims(mesh_shape, size)
    if arrangement is not None and len(shape) == 2:
        mesh = DeviceMesh(device_type, torch.tensor(arrangement, dtype=torch.int), mesh_dim_names=names)
    else:
        mesh = init_device_mesh(device_type, shape, mesh_dim_names=names)
    result = build(mesh)
    if isinstance(result, torch.nn.Module):
        built: dict[str, Any] = {"model": result}
    elif isinstance(result, tuple) and len(result) == 2:
        built = {"model": result[0], "optimizer": result[1]}
    elif isinstance(result, dict):
        built = dict(result)
    else:
        raise TypeError(
            f"build(mesh) must return the sharded model, (model, optimizer), or a dict of named objects; it returned "
            f"{type(result).__name__}."
        )
    modules = [n for n, v in built.items() if isinstance(v, torch.nn.Module)]
    optimizers = [n for n, v in built.items() if isinstance(v, torch.optim.Optimizer)]
    if len(modules) != 1 or len(optimizers) > 1:
        raise TypeError(
            f"build(mesh) must return one module and at most one optimizer (got modules {modules} and optimizers "
            f"{optimizers}); wrap several modules in one nn.Module."
        )
    for name, value in built.items():
        if name not in modules + optimizers and not callable(getattr(value, "state_dict", None)):
            raise TypeError(f"build(mesh) returned {name}={value!r}, which has no state_dict(); return only state.")
    return mesh, built


def hsdp_arrangement(mesh_shape: MeshShape | None, size: int, newest: Copy | None) -> list[list[int]] | None:
    """The ranks of the new world's HSDP mesh, placed so that a replica group holding the newest chunks keeps
    its shards (``shard_plan.arrange_mesh``, from one small all-gather of every member's newest copy); None for a
    1-D mesh. Every member calls it, at every reset."""
    shape, _ = mesh_dims(mesh_shape, size)
    if len(shape) != 2:
        return None
    hint = (newest.version, newest.place) if newest is not None and newest.place is not None else None
    return arrange_mesh((shape[0], shape[1]), all_gather_object(hint))


def mesh_place(mesh: Any) -> tuple[int, int, int] | None:
    """(shard size, row, column) of this rank on a 2-D mesh; None on a 1-D one."""
    if mesh.ndim != 2:
        return None
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return None
    return int(mesh.size(1)), int(coordinate[0]), int(coordinate[1])


def release_mesh(mesh: Any) -> None:
    """Let go of the groups a world's mesh holds.

    torch caches sharding specs that refer to the mesh, so the mesh outlives the world, and with it the process
    group in its registry. A gloo group closes its connections only when it is freed: held, a peer still
    waiting on this rank in a collective of the failed world would wait out the whole collective timeout
    instead of failing at once.
    """
    registry = getattr(mesh, "_pg_registry", None)
    if isinstance(registry, dict):
        registry.clear()
    forget_cached_meshes()


def forget_cached_meshes() -> None:
    """Empty torch's caches of sharding decisions, which keep the meshes of worlds that ended.

    A mesh equals any other of the same shape and ranks (torch compares neither the groups nor the process's
    place in them), so a new world's DTensor operation could take a cached answer that carries an old world's
    mesh: its tensors would then name the old groups, and this rank's place in the old world. A survivor that
    changed rank between two worlds of the same shape would compute the wrong chunk. The Python cache is per
    thread: this runs in the thread that trains, at every world's end and before every build.
    """
    try:
        from torch.distributed.tensor.debug import _clear_sharding_prop_cache
    except ImportError:  # pragma: no cover - a torch that moved it: the state checks every chunk's shape anyway
        return
    _clear_sharding_prop_cache()  # type: ignore[no-untyped-call]


class LiveShards:
    """The model, optimizer and other objects one ``build(mesh)`` made, as chunks and a replicated part."""

    def __init__(self, model: Any, optimizer: Any, others: dict[str, Any]) -> None:
        self.model, self.optimizer, self.others = model, optimizer, others
        self._state_dicts: tuple[dict[str, Any], dict[str, Any] | None] | None = None
        self.placements: dict[str, Any] = {}  # each sharded tensor's placements, as of the last layout()

    @classmethod
    def of(cls, built: Mapping[str, Any]) -> LiveShards:
        import torch

        model = next(v for v in built.values() if isinstance(v, torch.nn.Module))
        optimizer = next((v for v in built.values() if isinstance(v, torch.optim.Optimizer)), None)
        others = {n: v for n, v in built.items() if v is not model and v is not optimizer}
        return cls(model, optimizer, others)

    def _fetch(self, init_optimizer: bool) -> tuple[dict[str, Any], dict[str, Any] | None]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if self.optimizer is None:
            return get_model_state_dict(self.model), None
        if not init_optimizer and not self.optimizer.state:
            # torch's get_state_dict would give an optimizer without state some (a step at lr 0), and a step
            # count of 1: a fresh optimizer stays fresh, as it is in a job that never failed.
            groups = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
            return get_model_state_dict(self.model), {"state": {}, "param_groups": groups}
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return model_sd, optim_sd

    def _entries(self, fresh: bool = True, init_optimizer: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
        """(sharded: key → DTensor, plain: key → tensor or value) of the current state."""
        from torch.distributed.tensor import DTensor

        if fresh or self._state_dicts is None:
            self._state_dicts = self._fetch(init_optimizer)
        model_sd, optim_sd = self._state_dicts
        flat: dict[str, Any] = {f"model/{fqn}": value for fqn, value in model_sd.items()}
        if optim_sd is not None:
            for fqn, entries in optim_sd["state"].items():
                for name, value in entries.items():
                    flat[f"optimizer/{fqn}/{name}"] = value
        sharded = {k: v for k, v in flat.items() if isinstance(v, DTensor)}
        plain = {k: v for k, v in flat.items() if not isinstance(v, DTensor)}
        return sharded, plain

    def layout(self, init_optimizer: bool = False) -> Layout:
        """Which chunk of each sharded tensor this rank holds (fetches the state dicts anew). ``init_optimizer``:
        give an optimizer without state its state first, to load a committed one into."""
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        sharded, _ = self._entries(init_optimizer=init_optimizer)
        chunks = {}
        for key, tensor in sharded.items():
            shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
            if tuple(shape) != tuple(tensor._local_tensor.shape):
                raise RuntimeError(
                    f"{key}: this rank holds a chunk of shape {tuple(tensor._local_tensor.shape)}, but its mesh "
                    f"places a chunk of shape {tuple(shape)} here: the tensor's mesh is not this world's (a mesh "
                    "kept from an earlier world). Build every sharded object in build(mesh), from that mesh."
                )
            info = TensorInfo(tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))
            chunks[key] = ((tuple(offset), tuple(shape)), info)
            self.placements[key] = tuple(tensor.placements)
        return Layout(chunks)

    def copy_into(self, views: Mapping[str, Any]) -> None:
        """This rank's chunks into a copy's buffer (of the layout :meth:`layout` just fetched)."""
        import torch

        sharded, _ = self._entries(fresh=False)
        with torch.no_grad():
            for key, tensor in sharded.items():
                views[key].copy_(tensor.to_local())

    def replicated(self) -> dict[str, Any]:
        """What every rank holds alike: tensors that are not sharded, optimizer settings, the other objects."""
        from elastrain.executor._private.elastic.worker.handlers import clone

        _, plain = self._entries(fresh=False)
        optim_sd = self._state_dicts[1] if self._state_dicts is not None else None
        return {
            "plain": clone(plain),
            "param_groups": copy.deepcopy(optim_sd["param_groups"]) if optim_sd is not None else None,
            "optimizer_has_state": bool(optim_sd and optim_sd["state"]),
            "others": {name: copy.deepcopy(value.state_dict()) for name, value in self.others.items()},
        }

    def targets(self) -> dict[str, Any]:
        """Each sharded tensor's local chunk, to load into (of the state dicts :meth:`layout` fetched)."""
        import torch

        sharded, _ = self._entries(fresh=False)
        with torch.no_grad():
            return {key: tensor.to_local() for key, tensor in sharded.items()}

    def finish_load(self, replicated: Mapping[str, Any]) -> None:
        """The chunks are in :meth:`targets`: add the replicated part and load it all into the objects."""
        import torch
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if self._state_dicts is None:
            raise RuntimeError("finish_load() needs the state dicts layout() fetched.")
        model_sd, optim_sd = self._state_dicts
        with torch.no_grad():
            for key, value in replicated.get("plain", {}).items():
                _, _, rest = key.partition("/")
                if key.startswith("model/"):
                    model_sd[rest] = _placed(value, model_sd.get(rest))
                elif optim_sd is not None:
                    fqn, _, name = rest.rpartition("/")
                    optim_sd["state"].setdefault(fqn, {})[name] = _placed(
                        value, optim_sd["state"].get(fqn, {}).get(name)
                    )
        if optim_sd is not None and replicated.get("param_groups") is not None:
            for group, saved in zip(optim_sd["param_groups"], replicated["param_groups"], strict=True):
                group.update({k: copy.deepcopy(v) for k, v in saved.items() if k != "params"})
        if optim_sd is None:
            set_model_state_dict(self.model, model_sd)
        else:
            set_state_dict(self.model, self.optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
            if not replicated.get("optimizer_has_state", True):
                self.optimizer.state.clear()  # committed before its first step: so is the new one
        for name, saved in replicated.get("others", {}).items():
            if name in self.others:
                self.others[name].load_state_dict(copy.deepcopy(saved))

    def load_dcp(self, path: str) -> dict[str, Any]:
        """Load a sharded checkpoint (a DCP folder) into the objects, resharded onto this world; returns what it
        keeps besides the model and optimizer. Every member calls it at once (DCP plans over the world's group)."""
        import io
        import pickle

        from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
        from torch.distributed.checkpoint.filesystem import FileSystemReader
        from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

        if self._state_dicts is None:
            raise RuntimeError("load_dcp() needs the state dicts layout() fetched.")
        model_sd, optim_sd = self._state_dicts
        extra = io.BytesIO()
        state: dict[str, Any] = {"model": model_sd, "elastrain": extra}
        if optim_sd is not None:
            state["optimizer"] = optim_sd
        # Partial: a checkpoint of a commit before the optimizer's first step has no optimizer state to load.
        dcp_load(state, storage_reader=FileSystemReader(path), planner=DefaultLoadPlanner(allow_partial_load=True))
        loaded = state["elastrain"]
        kept: dict[str, Any] = pickle.loads(loaded.getvalue())  # noqa: S301 - the job's own checkpoint
        self.finish_load(
            {
                "param_groups": kept.get("param_groups"),
                "optimizer_has_state": kept.get("optimizer_has_state", True),
                "others": kept.get("others", {}),
            }
        )
        return kept

    def needed_parts(self, path: str) -> set[str]:
        """The parts (top folders) of the DCP checkpoint in ``path`` that loading into this rank's chunks reads:
        DCP's own load plan, from the checkpoint's index alone (``.metadata``), so a rank downloads only those."""
        import io

        from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
        from torch.distributed.checkpoint.filesystem import FileSystemReader

        if self._state_dicts is None:
            raise RuntimeError("needed_parts() needs the state dicts layout() fetched.")
        metadata = FileSystemReader(path).read_metadata()
        model_sd, optim_sd = self._state_dicts
        state: dict[str, Any] = {"model": model_sd, "elastrain": io.BytesIO()}
        if optim_sd is not None:
            state["optimizer"] = optim_sd
        planner = DefaultLoadPlanner(allow_partial_load=True)
        planner.set_up_planner(state, metadata, is_coordinator=False)
        storage = metadata.storage_data or {}
        parts = set()
        for item in planner.create_local_plan().items:
            relative = str(getattr(storage.get(item.storage_index), "relative_path", ""))
            if "/" in relative:  # a file at the top (a checkpoint written another way) came with the index
                parts.add(relative.split("/", 1)[0])
        return parts

    def forget_optimizer_init(self) -> None:
        """Nothing was loaded: an optimizer that got state only to be loaded into starts fresh after all."""
        if self.optimizer is not None:
            self.optimizer.state.clear()

    def load_from(self, views: Mapping[str, Any], replicated: Mapping[str, Any]) -> None:
        """Roll the objects back to a copy of this rank's own layout."""
        import torch

        with torch.no_grad():
            for key, target in self.targets().items():
                target.copy_(views[key])
        self.finish_load(replicated)


def _placed(value: Any, like: Any) -> Any:
    """``value`` on the device of the tensor it replaces."""
    import torch

    if isinstance(value, torch.Tensor) and isinstance(like, torch.Tensor):
        return value.to(like.device)
    return copy.deepcopy(value)
