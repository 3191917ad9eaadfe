"""State handlers: how ``TorchState`` saves, restores and syncs the objects it holds, in place.

A handler wraps one live object (a module, an optimizer, an LR scheduler, an ``ElasticSampler``, or a type of
your own) and keeps its committed copy. Restoring and syncing change that object in place, so the
``DataLoader``, scheduler or training loop that holds it keeps working with the live one. The registry maps
types to handler classes; the first matching entry wins, as in Horovod.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from elastrain.executor._private.elastic.worker.collectives import broadcast_object, broadcast_tensors
from elastrain.executor._private.elastic.worker.memory import cpu_copy, empty_cpu
from elastrain.executor._private.elastic.worker.reset import ResetPlan


class StateHandler:
    """Subclass to keep a type of your own in ``TorchState``: implement ``save``, ``restore`` and ``sync``.

    ``sync(source)`` runs on every worker at once and must leave ``value`` equal to rank ``source``'s (use
    :func:`elastic.broadcast_object <elastrain.executor.elastic.broadcast_object>` and
    :func:`elastic.broadcast_tensors <elastrain.executor.elastic.broadcast_tensors>`). ``snapshot`` and
    ``load_snapshot`` carry the committed copy to persistence; the defaults copy ``saved`` out and set it.

    At a reset ``TorchState`` calls :meth:`sync_at_reset` with the reset's plan (the source, this rank's role in
    the sync, whether its committed copy already holds what the source sends); the default calls
    ``sync(plan.source)``, and the state commits what the sync brought only once every handler's sync
    succeeded. Override it to use the plan; leave ``saved`` alone there and put the new committed copy in
    :meth:`stage`, so that a sync that fails partway leaves the committed copy as it was.
    """

    #: Set by ``sync`` when it also left ``saved`` equal to the synced value (the commit that follows a sync then
    #: skips this handler). Built-in handlers stage their committed copy instead (:meth:`stage`).
    saved_by_sync = False

    #: Also sync at a reset that only removed workers (``HostsUpdatedInterrupt(skip_sync=True)``): for objects
    #: whose partitioning depends on the world, like samplers.
    sync_on_every_reset = False

    #: Whether ``sync_at_reset`` counts its own units of transfer (``plan.progress``); else the state counts
    #: the whole sync as one.
    counts_units = False

    _staged: Any = None  # the committed copy a sync at a reset made, swapped in once the whole sync succeeded

    def __init__(self, value: Any) -> None:
        self.value = value
        self.saved: Any = None
        self.save()

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self, source: int) -> None:
        raise NotImplementedError

    def sync_at_reset(self, plan: ResetPlan) -> None:
        """The sync a reset runs (see the class); by default ``sync(plan.source)``."""
        self.sync(plan.source)

    def stage(self, committed: Any) -> None:
        """Make ``committed`` this handler's committed copy once the reset's whole sync succeeded."""
        self._staged = committed

    def _sync_planned(self, plan: ResetPlan) -> None:
        """``sync_at_reset(plan)``, unless a subclass overrode ``sync`` below the class that defines
        ``sync_at_reset`` (a user's subclass of a built-in handler): its own ``sync`` then runs."""
        mro = type(self).__mro__
        sync_from = next(c for c in mro if "sync" in c.__dict__)
        plan_from = next(c for c in mro if "sync_at_reset" in c.__dict__)
        if sync_from is not plan_from and issubclass(sync_from, plan_from):
            self.sync(plan.source)
        else:
            self.sync_at_reset(plan)

    def _adopt_staged(self) -> bool:
        """Swap the staged committed copy in; False when there was none."""
        if self._staged is None:
            return False
        self.saved, self._staged = self._staged, None
        return True

    def set_value(self, value: Any) -> None:
        """``state.name = value``: the handler takes the new object and commits it."""
        self.value = value
        self.save()

    def snapshot(self) -> Any:
        # A copy: commits copy into the committed buffers in place, and persistence pickles a snapshot in the
        # background, while training commits again.
        return clone(self.saved)

    def load_snapshot(self, saved: Any) -> None:
        self.saved = saved
        self.restore()


class ModuleHandler(StateHandler):
    """A ``torch.nn.Module``: its ``state_dict``, parameters and buffers overwritten in place."""

    def save(self) -> None:
        self.saved = copy_into(self.saved, self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self.saved)

    counts_units = True

    def sync(self, source: int) -> None:
        _sync_alone(self, source)

    def sync_at_reset(self, plan: ResetPlan) -> None:
        live = self.value.state_dict()
        signature = {name: (tuple(t.shape), str(t.dtype)) for name, t in live.items()}
        theirs = broadcast_object(signature, plan.source)
        if theirs != signature:
            raise ValueError(_mismatch("model", theirs, signature))
        names = list(live)
        committed = self.saved if isinstance(self.saved, dict) else {}
        staged: dict[str, Any] = {}

        def arrived(index: int) -> None:  # each tensor into the new committed copy as soon as it arrived
            name = names[index]
            staged[name] = _committed_for(plan, committed.get(name), live[name])
            plan.progress.unit_done()

        broadcast_tensors(list(live.values()), plan.source, after=arrived)
        self.stage({name: staged[name] for name in names})


class OptimizerHandler(StateHandler):
    """A ``torch.optim.Optimizer``: hyperparameters (``param_groups``, e.g. the learning rate) and per-parameter
    state. Tensors travel as tensors; a worker that has no state yet (a newcomer) allocates it."""

    def save(self) -> None:
        self.saved = copy_into(self.saved, self.value.state_dict())

    def restore(self) -> None:
        if not _load_in_place(self.value, self.saved):
            self.value.load_state_dict(clone(self.saved))

    counts_units = True

    def sync(self, source: int) -> None:
        _sync_alone(self, source)

    def sync_at_reset(self, plan: ResetPlan) -> None:
        import torch

        live = self.value.state_dict()
        skeleton = broadcast_object(_skeleton(live), plan.source)
        if len(skeleton["param_groups"]) != len(live["param_groups"]) or any(
            len(a["params"]) != len(b["params"])
            for a, b in zip(skeleton["param_groups"], live["param_groups"], strict=True)
        ):
            raise ValueError("The optimizer's parameter groups differ between workers; build it the same everywhere.")
        params = [p for group in self.value.param_groups for p in group["params"]]
        targets: list[Any] = []
        places: list[tuple[Any, str]] = []  # (parameter index, key) of each target
        state: dict[Any, dict[str, Any]] = {}
        for index, entries in skeleton["state"].items():
            mine = live["state"].get(index, {})
            state[index] = {}
            for key, spec in entries.items():
                if not isinstance(spec, _TensorSpec):
                    state[index][key] = spec
                    continue
                current = mine.get(key)
                if not (isinstance(current, torch.Tensor) and spec.matches(current)):
                    dtype = getattr(torch, spec.dtype)
                    # Touched before the receive: faulting fresh pages in while gloo writes into them is several
                    # times slower.
                    if spec.on_cpu or params[index].device.type == "cpu":
                        current = empty_cpu(spec.shape, dtype).zero_()
                    else:
                        current = torch.zeros(spec.shape, dtype=dtype, device=params[index].device)
                state[index][key] = current
                targets.append(current)
                places.append((index, key))
        previous = self.saved["state"] if isinstance(self.saved, dict) else {}
        staged_state = {index: dict(entries) for index, entries in skeleton["state"].items()}

        def arrived(position: int) -> None:  # each tensor into the new committed copy as soon as it arrived
            index, key = places[position]
            staged_state[index][key] = _committed_for(plan, previous.get(index, {}).get(key), targets[position])
            plan.progress.unit_done()

        broadcast_tensors(targets, plan.source, after=arrived)
        received = {"state": state, "param_groups": skeleton["param_groups"]}
        if not _load_in_place(self.value, received, adopt=True):
            self.value.load_state_dict(received)
        self.stage({"state": staged_state, "param_groups": copy.deepcopy(skeleton["param_groups"])})


class SchedulerHandler(StateHandler):
    """A ``torch.optim.lr_scheduler.LRScheduler``: its ``state_dict`` (last epoch, base and last LRs)."""

    def save(self) -> None:
        self.saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(copy.deepcopy(self.saved))

    def sync(self, source: int) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), source))


class SamplerHandler(SchedulerHandler):
    """An ``ElasticSampler``: its progress through the epoch, re-split over the new world at every reset."""

    sync_on_every_reset = True


class StateDictHandler(SchedulerHandler):
    """Any object with ``state_dict()`` and ``load_state_dict()`` (a ``GradScaler``, a stateful data loader)."""


# -- the registry --------------------------------------------------------------------------------------------

_registry: list[tuple[type, type[StateHandler]]] | None = None


def get_handler_registry() -> list[tuple[type, type[StateHandler]]]:
    """The ordered ``(type, handler class)`` list ``TorchState`` consults; the first match wins."""
    global _registry
    if _registry is None:
        import torch

        from elastrain.executor._private.elastic.worker.sampler import ElasticSampler

        _registry = [
            (torch.nn.Module, ModuleHandler),
            (torch.optim.Optimizer, OptimizerHandler),
            (torch.optim.lr_scheduler.LRScheduler, SchedulerHandler),
            (ElasticSampler, SamplerHandler),
        ]
    return list(_registry)


def set_handler_registry(registry: list[tuple[type, type[StateHandler]]]) -> None:
    """Replace the registry, e.g. ``set_handler_registry([(MyType, MyHandler), *get_handler_registry()])``."""
    global _registry
    for entry in registry:
        if not (
            isinstance(entry, tuple)
            and len(entry) == 2
            and isinstance(entry[0], type)
            and isinstance(entry[1], type)
            and issubclass(entry[1], StateHandler)
        ):
            raise TypeError(
                f"set_handler_registry takes (type, StateHandler subclass) pairs, got {entry!r} in the list."
            )
    _registry = list(registry)


def handler_for(value: Any) -> Callable[[Any], StateHandler] | None:
    for kind, handler in get_handler_registry():
        if isinstance(value, kind):
            return handler
    return None


# -- copies --------------------------------------------------------------------------------------------------


def clone(value: Any) -> Any:
    """A deep copy in which tensors are detached clones on the CPU."""
    return copy_into(None, value)


def copy_into(saved: Any, live: Any) -> Any:
    """A deep copy of ``live`` with tensors on the CPU, reusing ``saved``'s tensors where shapes match.

    Commits happen every few steps: copying into the committed buffers instead of allocating new ones keeps one
    committed copy per worker and spares the allocator and page faults a model's worth of fresh memory.
    """
    import torch

    if isinstance(live, torch.Tensor):
        if (
            isinstance(saved, torch.Tensor)
            and saved.shape == live.shape
            and saved.dtype == live.dtype
            and saved.device.type == "cpu"
        ):
            return saved.copy_(live.detach())
        return cpu_copy(live)
    if isinstance(live, dict):
        previous = saved if isinstance(saved, dict) else {}
        return {key: copy_into(previous.get(key), item) for key, item in live.items()}
    if isinstance(live, list | tuple):
        previous_items = list(saved) if isinstance(saved, list | tuple) and len(saved) == len(live) else []
        items = [copy_into(previous_items[i] if previous_items else None, item) for i, item in enumerate(live)]
        return items if isinstance(live, list) else type(live)(items)
    return copy.deepcopy(live)


def _sync_alone(handler: StateHandler, source: int) -> None:
    """A built-in handler's sync outside a reset: what a reset's sync does, committed at once."""
    import torch.distributed as dist

    handler.sync_at_reset(ResetPlan.standalone(source, dist.get_rank()))
    handler._adopt_staged()


def _committed_for(plan: ResetPlan, committed: Any, arrived: Any) -> Any:
    """The committed copy of a tensor the sync just moved: the one held already where it matches (see
    ``ResetPlan.keeps_committed``), else a fresh copy; never the old buffer overwritten, so a sync that fails
    later leaves the committed copy whole."""
    if plan.keeps_committed and _same_layout(committed, arrived):
        return committed
    return cpu_copy(arrived)


def _same_layout(committed: Any, live: Any) -> bool:
    """Whether a committed tensor can stand for ``live`` (a reset callback may have reshaped or cast it)."""
    import torch

    return isinstance(committed, torch.Tensor) and committed.shape == live.shape and committed.dtype == live.dtype


class _TensorSpec:
    """A tensor's shape and dtype, sent instead of its data."""

    def __init__(self, tensor: Any) -> None:
        self.shape = tuple(tensor.shape)
        self.dtype = str(tensor.dtype).removeprefix("torch.")
        self.on_cpu = tensor.device.type == "cpu"

    def matches(self, tensor: Any) -> bool:
        return tuple(tensor.shape) == self.shape and str(tensor.dtype).removeprefix("torch.") == self.dtype


def _skeleton(state_dict: dict[str, Any]) -> dict[str, Any]:
    import torch

    return {
        "state": {
            index: {k: _TensorSpec(v) if isinstance(v, torch.Tensor) else copy.deepcopy(v) for k, v in entry.items()}
            for index, entry in state_dict["state"].items()
        },
        "param_groups": copy.deepcopy(state_dict["param_groups"]),
    }


def _load_in_place(optimizer: Any, state_dict: dict[str, Any], adopt: bool = False) -> bool:
    """Apply ``state_dict`` by copying into the optimizer's own tensors; False when their layout differs.

    ``adopt``: the tensors in ``state_dict`` are the optimizer's own already (a sync received into them).
    """
    import torch

    params = [p for group in optimizer.param_groups for p in group["params"]]
    live = optimizer.state
    if set(state_dict["state"]) != {i for i, p in enumerate(params) if p in live}:
        return False
    for index, entry in state_dict["state"].items():
        mine = live[params[index]]
        if set(mine) != set(entry):
            return False
        for key, value in entry.items():
            if isinstance(value, torch.Tensor) != isinstance(mine[key], torch.Tensor):
                return False
            if isinstance(value, torch.Tensor) and (value.shape != mine[key].shape or value.dtype != mine[key].dtype):
                return False
    for index, entry in state_dict["state"].items():
        mine = live[params[index]]
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                if not (adopt and value is mine[key]):
                    mine[key].copy_(value)
            else:
                mine[key] = copy.deepcopy(value)
    for group, saved_group in zip(optimizer.param_groups, state_dict["param_groups"], strict=True):
        for key, value in saved_group.items():
            if key != "params":
                group[key] = copy.deepcopy(value)
    return True


def _mismatch(what: str, theirs: dict[str, Any], mine: dict[str, Any]) -> str:
    missing = sorted(set(theirs) - set(mine))[:5]
    extra = sorted(set(mine) - set(theirs))[:5]
    differing = sorted(k for k in set(theirs) & set(mine) if theirs[k] != mine[k])[:5]
    return (
        f"The {what} differs between workers (missing here: {missing}, only here: {extra}, other shape or dtype: "
        f"{differing}); every worker must build the same {what}."
    )
