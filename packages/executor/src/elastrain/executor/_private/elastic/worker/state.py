"""Training state that survives resets: committed in memory, restored on failure, synced across every new world."""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from elastrain.executor._private.elastic.worker import runtime
from elastrain.executor._private.elastic.worker.collectives import broadcast_object
from elastrain.executor._private.elastic.worker.faults import fault_point
from elastrain.executor._private.elastic.worker.handlers import StateHandler, handler_for
from elastrain.executor._private.elastic.worker.reset import ResetPlan, StateLoss, SyncRole
from elastrain.executor._private.elastic.worker.state_loss import resume_persisted, start_over, state_lost_error

logger = logging.getLogger("elastrain.executor")

# State's own bookkeeping lives under this one attribute, so no user value can clash with it.
_BOOK = "_elastic"


@dataclass
class _Bookkeeping:
    commits: int = 0  # commits this copy holds; picks the sync source, so it changes only after a sync succeeded
    sync_source: int = 0  # the rank that sync() copies from, while it runs
    reset_callbacks: list[Callable[[], None]] = field(default_factory=list)
    persistence: Any = None
    value_names: list[str] = field(default_factory=list)
    saved_values: dict[str, Any] = field(default_factory=dict)
    handlers: dict[str, StateHandler] = field(default_factory=dict)
    # The live state is the committed copy: set when a reset starts from an interrupt that commit() raised, or
    # from a rollback; read and cleared by the sync that follows.
    at_commit: bool = False
    commit_interrupt: BaseException | None = None  # the HostsUpdatedInterrupt that commit() raised last
    synced: bool = False  # received state once (a sync or a persisted copy): no longer a newcomer
    plan: ResetPlan | None = None  # the reset's plan, while its sync runs


class State:
    """Base class of elastic state: subclasses implement :meth:`save`, :meth:`restore` and :meth:`sync`.

    ``commit()`` saves an in-memory copy and checks for host updates; a failure rolls the job back to the last
    commit, so only the steps after it are redone. At every reset the reset callbacks run, then ``sync()`` makes
    every worker of the new world hold the state of the worker with the most commits (:attr:`sync_source`).
    """

    def __init__(self) -> None:
        if _BOOK not in self.__dict__:
            self.__dict__[_BOOK] = _Bookkeeping()

    @property
    def _book(self) -> _Bookkeeping:
        book: _Bookkeeping = self.__dict__[_BOOK]
        return book

    @property
    def commit_count(self) -> int:
        """How many commits the committed copy holds (what persistence numbers its copies by)."""
        return self._book.commits

    @property
    def sync_source(self) -> int:
        """Inside :meth:`sync`: the rank every worker copies from (the lowest rank with the most commits)."""
        return self._book.sync_source

    def persist_with(self, persistence: Any) -> None:
        """Also keep committed state outside the job, e.g. ``elastrain.durable.StatePersistence(uri, every=10)``.

        A sharded persistence (``elastrain.durable.ShardedStatePersistence(uri)``) has every rank write a share of
        the state in PyTorch's DCP format, each of N ranks about 1/N of it. Otherwise rank 0 hands the persistence
        the state after every commit (``persistence.committed(state)``); when no worker has
        committed state yet (a fresh job, or every worker holding it was lost), the workers load the latest
        persisted state instead of starting over (``persistence.latest()`` names it, ``persistence.load(name)``
        returns ``(snapshot, commits)``); when the training function returns, ``persistence.flush()`` waits for
        the upload in flight. If it has a ``rank_changed(rank)`` method, every worker calls it at each reset, so a
        former rank 0 can drop copies it still had queued.
        """
        if getattr(persistence, "sharded", False):
            # Every rank writes a share of the whole state (DCP gives each tensor to one rank).
            from elastrain.executor._private.elastic.worker.replicated_persist import EveryRankPersistence

            persistence = EveryRankPersistence(persistence)
        for method in ("committed", "latest", "load", "flush"):
            if not callable(getattr(persistence, method, None)):
                raise TypeError(f"persist_with needs an object with a {method}() method, got {persistence!r}.")
        self._book.persistence = persistence

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Functions to call at each reset, before the state is synced (e.g. to rescale the learning rate to the
        new world size). They run on every member of the new world; what they change in the state reaches every
        worker through the sync. Keep them idempotent: set values from the world, don't accumulate."""
        if not isinstance(callbacks, list | tuple) or not all(callable(c) for c in callbacks):
            raise TypeError(f"register_reset_callbacks takes a list of functions, got {callbacks!r}.")
        self._book.reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """What a reset runs before the sync: :meth:`reset`, then the reset callbacks in order."""
        self.reset()
        for callback in self._book.reset_callbacks:
            callback()

    def reset(self) -> None:
        """A hook for subclasses, called at every reset before the reset callbacks."""

    def commit(self) -> None:
        """Keep a copy of the state to roll back to, then leave for a new world if one is waiting."""
        self.save()
        self._book.commits += 1
        runtime.held_commits(self._book.commits)
        persistence = self._book.persistence
        if persistence is not None and runtime.rank() == 0:
            fault_point("persist_handoff")
            persistence.committed(self)
        elif getattr(persistence, "every_rank", False):
            persistence.committed(self)
        try:
            self.check_host_updates()
        except runtime.HostsUpdatedInterrupt as interrupt:
            self._book.commit_interrupt = interrupt  # raised right after the save: the live state is committed
            raise

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every worker at once when the driver published a new world.

        Nothing is rolled back: work done since the last commit is kept and synced to the new world.
        """
        runtime.check_host_updates()

    def snapshot(self) -> Any:
        """The committed copy, as one picklable object (what persistence stores)."""
        raise NotImplementedError

    def load_snapshot(self, snapshot: Any, commits: int) -> None:
        """Make ``snapshot`` the committed copy and roll back to it."""
        raise NotImplementedError

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def sync_on_every_reset(self) -> None:
        """The part of :meth:`sync` that depends on the world (a sampler's split): run even at a reset that only
        removed workers, when the full sync is skipped. Nothing by default."""

    def _roll_back(self) -> None:
        """Restore the last commit after a failed collective (the reset that follows syncs every member)."""
        self.restore()
        self._book.at_commit, self._book.commit_interrupt = True, None

    def _interrupted(self, interrupt: BaseException) -> None:
        """A reset starts from ``interrupt``: the live state is the last commit only if commit() raised it (not
        the training code, nor a commit whose interrupt the training code caught and then trained on)."""
        book = self._book
        book.at_commit, book.commit_interrupt = interrupt is book.commit_interrupt, None

    def _pre_sync_role(self) -> str:
        """What this worker is as a reset begins (the fault points' roles before the source is known)."""
        book = self._book
        if book.commits == 0 and not book.synced:
            return "newcomer"
        return "survivor_at_commit" if book.at_commit else "survivor_between_commits"

    def _synchronize(self, *, skip_sync: bool = False) -> None:
        """Make every member of the new world hold one state, as the reset's plan says (``reset.py``); the
        committed copy and the commit count change only once that worked."""
        book = self._book
        role_before = self._pre_sync_role()
        at_commit, book.at_commit = book.at_commit, False
        persistence = book.persistence
        rank_changed = getattr(persistence, "rank_changed", None)
        if callable(rank_changed):
            try:  # before a collective: raising here would leave the other ranks waiting in it
                rank_changed(runtime.rank())
            except Exception as error:
                logger.warning("persistence.rank_changed failed (%s); persisting goes on.", error)
        job = runtime.current()
        plan = job.plan_reset(book.commits, skip_sync, at_commit, persistence is not None)
        job.role = "source" if plan.role is SyncRole.SOURCE else role_before
        if plan.role is SyncRole.LOAD_PERSISTED:
            name = broadcast_object(persistence.latest() if plan.rank == plan.source else None, plan.source)
            if name is not None:
                resume_persisted(self, plan, persistence, name)
                fault_point("reset_callbacks", role=role_before)
                self.on_reset()  # the persisted state was made for another world: fit it to this one
                return
            plan = plan.without_persisted(job.start_over_on_state_loss)
        if plan.loss is StateLoss.FAIL:
            raise state_lost_error(plan, persisted=persistence is not None)
        if plan.loss is StateLoss.START_OVER:
            start_over(self, plan)
        book.sync_source = plan.source
        if plan.run_callbacks:
            fault_point("reset_callbacks", role=role_before)
            self.on_reset()
        fault_point("sync_before")
        book.plan = plan
        try:
            if plan.skip_sync:
                self.sync_on_every_reset()  # every member kept the same state: only the split changes
            else:
                # Every member's live state is overwritten, so all train on from one state (with what the reset
                # callbacks changed); committed copies change only below, once every part arrived.
                self.sync()
            fault_point("sync_after")
        except BaseException:
            self._discard_staged()
            raise
        finally:
            book.plan = None
        self._save_after_sync()
        book.commits, book.synced = plan.best, True
        runtime.held_commits(plan.best)

    def _discard_staged(self) -> None:
        """A sync failed partway: drop the committed copies it staged (the committed copy stays as it was)."""

    def _save_after_sync(self) -> None:
        """Commit what the sync brought, so that every member rolls back to the same state."""
        self.save()


class ObjectState(State):
    """Plain Python values as attributes: ``ObjectState(epoch=0, batch=0)``; ``state.epoch += 1``."""

    def __init__(self, **values: Any) -> None:
        super().__init__()
        self._set_values(values)
        self.save()

    def _set_values(self, values: dict[str, Any]) -> None:
        _check_names(type(self), values)
        self._book.value_names.extend(values)
        for name, value in values.items():
            setattr(self, name, value)

    def _values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._book.value_names}

    def save(self) -> None:
        self._book.saved_values = copy.deepcopy(self._values())

    def restore(self) -> None:
        for name, value in copy.deepcopy(self._book.saved_values).items():
            setattr(self, name, value)

    def sync(self) -> None:
        names = self._book.value_names
        theirs = broadcast_object(self._values() if runtime.rank() == self.sync_source else None, self.sync_source)
        if sorted(theirs) != sorted(names):
            raise ValueError(
                f"The state's values differ between workers ({sorted(theirs)} vs {sorted(names)} here); every worker "
                "must build the same state."
            )
        for name, value in theirs.items():
            setattr(self, name, value)
        if self._book.plan is not None:
            self._book.plan.progress.unit_done()

    def snapshot(self) -> Any:
        return self._book.saved_values  # replaced, never changed, by each save: safe to hand over

    def load_snapshot(self, snapshot: Any, commits: int) -> None:
        self._book.saved_values, self._book.commits = snapshot, commits
        self.restore()


class TorchState(ObjectState):
    """Models, optimizers, LR schedulers, samplers and plain values: ``TorchState(model, optimizer, epoch=0)``.

    Every keyword whose value matches the handler registry (``torch.nn.Module``, ``torch.optim.Optimizer``,
    ``LRScheduler``, ``ElasticSampler``, and types you register) is kept by its handler: saved by its
    ``state_dict`` (tensors copied to the CPU), restored and synced in place, so the objects you hold stay the
    live ones. Other keywords are plain values, deep-copied at each commit. ``state.model = other`` swaps the
    object and commits it.
    """

    def __init__(self, model: Any = None, optimizer: Any = None, **values: Any) -> None:
        State.__init__(self)
        plain: dict[str, Any] = {}
        handlers: dict[str, StateHandler] = {}
        for name, value in {"model": model, "optimizer": optimizer, **values}.items():
            _refuse_bound_ddp(name, value)
            handler = handler_for(value) if value is not None else None
            if handler is None:
                plain[name] = value
            else:
                handlers[name] = handler(value)
        self._book.handlers.update(handlers)
        self._set_values(plain)
        ObjectState.save(self)

    def __getattr__(self, name: str) -> Any:
        handlers = self.__dict__.get(_BOOK, _Bookkeeping()).handlers
        if name in handlers:
            return handlers[name].value
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get(_BOOK, _Bookkeeping()).handlers
        if name in handlers:
            handlers[name].set_value(value)
        else:
            super().__setattr__(name, value)

    def _set_values(self, values: dict[str, Any]) -> None:
        _check_names(type(self), self._book.handlers)
        super()._set_values(values)

    def save(self) -> None:
        for done, handler in enumerate(self._book.handlers.values(), start=1):
            handler.save()
            fault_point("commit_copy_mid", done=done)
        super().save()

    def restore(self) -> None:
        for handler in self._book.handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        self._check_same_handlers()
        plan = self._book.plan
        for handler in self._book.handlers.values():
            if plan is None:  # called outside a reset: each handler syncs and commits on its own, as it did
                handler.sync(self.sync_source)
                continue
            handler._sync_planned(plan)
            if not handler.counts_units:
                plan.progress.unit_done()
        super().sync()

    def _save_after_sync(self) -> None:
        for handler in self._book.handlers.values():
            if handler._adopt_staged():
                continue  # copied while the sync ran, tensor by tensor
            if handler.saved_by_sync:
                handler.saved_by_sync = False  # a handler of the user's own that saved while it synced
            else:
                handler.save()
        ObjectState.save(self)

    def _discard_staged(self) -> None:
        for handler in self._book.handlers.values():
            handler.stage(None)
            handler.saved_by_sync = False

    def sync_on_every_reset(self) -> None:
        self._check_same_handlers()
        for handler in self._book.handlers.values():
            if handler.sync_on_every_reset:
                handler.sync(self.sync_source)

    def _check_same_handlers(self) -> None:
        mine = {name: type(handler).__name__ for name, handler in self._book.handlers.items()}
        theirs = broadcast_object(mine if runtime.rank() == self.sync_source else None, self.sync_source)
        if theirs != mine:
            raise ValueError(
                f"The state differs between workers ({theirs} vs {mine} here); every worker must build the same "
                "TorchState."
            )

    def snapshot(self) -> Any:
        """``{"handlers": {name: committed state_dict}, "values": {name: value}}``, tensors on the CPU."""
        return {
            "handlers": {name: handler.snapshot() for name, handler in self._book.handlers.items()},
            "values": super().snapshot(),
        }

    def load_snapshot(self, snapshot: Any, commits: int) -> None:
        if isinstance(snapshot, tuple):  # (model, optimizer, values): what executors before handlers persisted
            model, optimizer, values = snapshot
            handlers = {k: v for k, v in (("model", model), ("optimizer", optimizer)) if v is not None}
            snapshot = {"handlers": handlers, "values": values}
        for name, saved in snapshot["handlers"].items():
            self._book.handlers[name].load_snapshot(saved)
        super().load_snapshot(snapshot["values"], commits)


def _check_names(cls: type, names: Iterable[str]) -> None:
    reserved = {name for name in dir(cls) if not name.startswith("_")}
    clashes = sorted(name for name in names if name in reserved or name.startswith(_BOOK))
    if clashes:
        raise ValueError(
            f"{cls.__name__} value name(s) {clashes} are taken by the state's own methods; rename them "
            f"(taken: {sorted(reserved)})."
        )


def _refuse_bound_ddp(name: str, value: Any) -> None:
    """torch's own DDP stays bound to the group it was built on, and the first reset breaks it: say what to use."""
    distributed = sys.modules.get("torch.nn.parallel.distributed")
    if distributed is not None and isinstance(value, distributed.DistributedDataParallel):
        raise TypeError(
            f"TorchState({name}=...) got torch.nn.parallel.DistributedDataParallel, which stays bound to the process "
            "group it was built with and fails at the first reset. Wrap the model with "
            "elastrain.executor.elastic.DistributedDataParallel (same arguments) instead: it follows every new group."
        )
