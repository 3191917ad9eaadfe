"""Training state that survives resets: committed in memory, restored on failure, synced to new workers."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from elastrain.executor._private.elastic import runtime


class State:
    """Base class of elastic state. Subclasses implement :meth:`save`, :meth:`restore` and :meth:`sync`.

    ``commit()`` saves an in-memory copy and checks for host updates; on a failure the job rolls back to the last
    commit, so only the steps after it are redone. After every reset, ``sync()`` makes every worker hold the
    state of a surviving worker, then the reset callbacks run.
    """

    def __init__(self) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []
        self._persistence: Any = None
        self.commits = 0

    def persist_with(self, persistence: Any) -> None:
        """Also keep committed state outside the job, e.g. ``elastrain.durable.StatePersistence(uri, every=10)``.

        Rank 0 hands it the state after every commit (``persistence.committed(state)``); when no worker has
        committed state yet (a fresh job, or every worker holding it was lost), the workers load the latest
        persisted state instead of starting over (``persistence.latest()`` names it, ``persistence.load(name)``
        returns ``(snapshot, commits)``); when the training function returns, ``persistence.flush()`` waits for
        the upload in flight.
        """
        for method in ("committed", "latest", "load", "flush"):
            if not callable(getattr(persistence, method, None)):
                raise TypeError(f"persist_with needs an object with a {method}() method, got {persistence!r}.")
        self._persistence = persistence

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Functions to call after each reset (e.g. to rescale the learning rate to the new world size)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Keep a copy of the state to roll back to, then leave for a larger world if one is waiting."""
        self.save()
        self.commits += 1
        if self._persistence is not None and runtime.rank() == 0:
            self._persistence.committed(self)
        self.check_host_updates()

    def snapshot(self) -> Any:
        """The committed copy, as one picklable object (what persistence stores)."""
        raise NotImplementedError

    def load_snapshot(self, snapshot: Any, commits: int) -> None:
        """Make ``snapshot`` the committed copy and roll back to it."""
        raise NotImplementedError

    def _sync_source(self) -> int | None:
        """The rank to sync from, or None when every worker just loaded the persisted state instead."""
        source, self.commits = runtime.choose_sync_source(self.commits)
        if self.commits > 0 or self._persistence is None:
            return source
        # No worker has committed state: load the latest persisted state, the same one everywhere.
        name = runtime.broadcast_object(self._persistence.latest() if runtime.rank() == source else None, source)
        if name is None:
            return source
        snapshot, commits = self._persistence.load(name)
        self.load_snapshot(snapshot, commits)
        return None

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every worker at once when the driver prepared a new world."""
        runtime.check_host_updates()

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError


class ObjectState(State):
    """Plain Python values as attributes: ``ObjectState(epoch=0, batch=0)``; ``state.epoch += 1``."""

    def __init__(self, **values: Any) -> None:
        self._names = list(values)
        for name, value in values.items():
            setattr(self, name, value)
        super().__init__()
        self._saved: dict[str, Any] = {}
        self.save()

    def _values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._names}

    def save(self) -> None:
        self._saved = copy.deepcopy(self._values())

    def restore(self) -> None:
        for name, value in copy.deepcopy(self._saved).items():
            setattr(self, name, value)

    def sync(self) -> None:
        source = self._sync_source()
        if source is None:
            return
        self._saved = runtime.broadcast_object(self._saved if runtime.rank() == source else None, source)
        self.restore()

    def snapshot(self) -> Any:
        return self._saved  # replaced, never changed, by each save: safe to hand over

    def load_snapshot(self, snapshot: Any, commits: int) -> None:
        self._saved, self.commits = snapshot, commits
        self.restore()


class TorchState(ObjectState):
    """A model, an optimizer and plain values: ``TorchState(model=model, optimizer=optimizer, epoch=0)``.

    ``save`` copies the model's and optimizer's ``state_dict`` (tensors cloned, so later steps don't change the
    copy); ``sync`` broadcasts the committed copy from a surviving worker to all.
    """

    def __init__(self, model: Any = None, optimizer: Any = None, **values: Any) -> None:
        self.model = model
        self.optimizer = optimizer
        self._saved_model: Any = None
        self._saved_optimizer: Any = None
        super().__init__(**values)

    def save(self) -> None:
        if self.model is not None:
            self._saved_model = _clone(self.model.state_dict())
        if self.optimizer is not None:
            self._saved_optimizer = _clone(self.optimizer.state_dict())
        super().save()

    def restore(self) -> None:
        if self.model is not None and self._saved_model is not None:
            self.model.load_state_dict(self._saved_model)
        if self.optimizer is not None and self._saved_optimizer is not None:
            self.optimizer.load_state_dict(_clone(self._saved_optimizer))
        super().restore()

    def sync(self) -> None:
        source = self._sync_source()
        if source is None:
            return
        payload = self.snapshot() if runtime.rank() == source else None
        self._saved_model, self._saved_optimizer, self._saved = runtime.broadcast_object(payload, source)
        self.restore()

    def snapshot(self) -> Any:
        return (self._saved_model, self._saved_optimizer, self._saved)

    def load_snapshot(self, snapshot: Any, commits: int) -> None:
        (self._saved_model, self._saved_optimizer, self._saved), self.commits = snapshot, commits
        self.restore()


def _clone(value: Any) -> Any:
    """A deep copy in which tensors are detached clones on the CPU."""
    try:
        import torch
    except ImportError:  # pragma: no cover - TorchState without torch has nothing to clone
        return copy.deepcopy(value)
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _clone(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_clone(item) for item in value)
    return copy.deepcopy(value)
