"""Durable Tune trials: a function trainable or a ``Trainable`` class whose checkpoints live in a
``CheckpointStore`` of its own, saved in the background and collected to exactly ``num_to_keep``."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

from elastrain.tune._private.trial import TrialIdentity, TrialStorage

logger = logging.getLogger("elastrain.tune")

# The trial whose store this process holds (a Tune actor may be reused for another trial).
_held: dict[str, TrialStorage] = {}


def trial_store(
    storage: str,
    *,
    num_to_keep: int | None = 2,
    storage_options: Mapping[str, Any] | None = None,
    timeout_s: float = 60.0,
    **store_options: Any,
) -> Any:
    """The running function trial's ``CheckpointStore``: ``<storage>/<experiment>/<trial id>``.

    Call it at the top of a Tune function trainable. A trial that Tune restarts (after losing its node, say)
    gets the same store back: resume from ``store.latest()``, starting ``store.restore_async(...)`` before
    building the model so that the download overlaps it. Save with ``store.save_async(...)``: the trial goes on
    while the upload runs, the commit is atomic, and collection keeps exactly ``num_to_keep``. Other keywords
    go to ``CheckpointStore``. The store is checked with a deadline of ``timeout_s`` (reachable, this
    experiment's, this trial's, no other live trial writing it).
    """
    _end_with_node()
    place = _open(storage, TrialIdentity.current(), storage_options, timeout_s, store_options.get("sync_client"))
    return _trial_checkpoint_store(place, num_to_keep=num_to_keep, storage_options=storage_options, **store_options)


def _trial_checkpoint_store(place: TrialStorage, **options: Any) -> Any:
    """A ``CheckpointStore`` on the trial's folder, returned before the folder is checked: reads wait for the check
    and writes for the lock too, so that ``trial_store(...)`` and ``restore_async(...)`` return at once and a
    restarted trial downloads its checkpoint while it imports torch and builds its model."""
    from elastrain.durable import CheckpointStore

    class TrialCheckpointStore(CheckpointStore):
        def list(self) -> Any:
            place.wait_checked()
            return super().list()

        def latest(self) -> Any:
            place.wait_checked()
            return super().latest()

        def best(self) -> Any:
            place.wait_checked()
            return super().best()

        def restore(self, *args: Any, **kwargs: Any) -> Any:  # restore_async runs it in a thread of its own
            place.wait_checked()
            return super().restore(*args, **kwargs)

        def save(self, *args: Any, **kwargs: Any) -> Any:
            place.wait_held()
            return super().save(*args, **kwargs)

        def save_async(self, *args: Any, **kwargs: Any) -> Any:
            place.wait_held()
            return super().save_async(*args, **kwargs)

    return TrialCheckpointStore(place.uri, **options)


def _open(
    storage: str,
    identity: TrialIdentity,
    storage_options: Mapping[str, Any] | None,
    timeout_s: float,
    sync_client: Any = None,
) -> TrialStorage:
    held = _held.get(identity.trial_id)
    if held is not None and held.base_uri == storage.rstrip("/") and held.identity == identity:
        return held
    for trial_id in list(_held):  # a reused Tune actor moved on to another trial
        _held.pop(trial_id).release()
    place = TrialStorage(storage, identity, storage_options, timeout_s, sync_client).open(check_in_background=True)
    _held[identity.trial_id] = place
    return place


def _trainable_base() -> type:
    from ray import tune

    return tune.Trainable


class DurableTrainable(_trainable_base()):  # type: ignore[misc]
    """A Tune ``Trainable`` whose checkpoints go to a ``CheckpointStore`` of its own.

    Set ``storage`` (a base URI), and ``num_to_keep`` and ``storage_options`` (or ``sync_client``) if needed, as
    class attributes;
    implement ``setup``/``step`` as usual, and ``save_state(directory)`` / ``load_state(directory)`` instead of
    ``save_checkpoint``/``load_checkpoint``. A save hands the files to ``save_async`` and returns once they are
    staged, so Tune's loop is not held up by the upload; what Tune keeps is a small record naming the checkpoint.
    A restore takes that checkpoint once it is committed, else the latest committed one. A trial that Tune
    starts again without a checkpoint of its own (its first save was still uploading) resumes from the latest
    committed one too.
    """

    storage: str | None = None
    num_to_keep: int | None = 2
    storage_options: Mapping[str, Any] | None = None
    sync_client: Any = None  # an elastrain-durable SyncClient (instead of storage_options), e.g. ArrowSyncClient
    timeout_s: float = 60.0

    def save_state(self, directory: str) -> None:
        raise NotImplementedError("A DurableTrainable implements save_state(directory): write the trial's state there.")

    def load_state(self, directory: str) -> None:
        raise NotImplementedError(
            "A DurableTrainable implements load_state(directory): read the trial's state from there."
        )

    @property
    def store(self) -> Any:
        """This trial's ``CheckpointStore``, opened on first use."""
        store = self.__dict__.get("_durable_store")
        if store is not None and self.__dict__.get("_durable_trial") != self.trial_id:
            store.close()  # Tune reused this actor for another trial (reuse_actors=True): that trial's store now
            store = None
        if store is None:
            _end_with_node()
            if not isinstance(self.storage, str) or not self.storage:
                raise ValueError(
                    f"{type(self).__name__}.storage must be a base URI such as 's3://bucket/tune', "
                    f"got {self.storage!r}."
                )
            identity = TrialIdentity.of_trainable(self)
            place = _open(self.storage, identity, self.storage_options, self.timeout_s, self.sync_client)
            store = _trial_checkpoint_store(
                place, num_to_keep=self.num_to_keep, storage_options=self.storage_options, sync_client=self.sync_client
            )
            self.__dict__["_durable_store"] = store
            self.__dict__["_durable_uri"] = place.uri
            self.__dict__["_durable_trial"] = self.trial_id
        return store

    @property
    def store_uri(self) -> str:
        """Where this trial's checkpoints are: ``<storage>/<experiment>/<trial id>``."""
        self.store  # noqa: B018 - opens it
        return str(self.__dict__["_durable_uri"])

    def train(self) -> dict[str, Any]:
        if not self.__dict__.get("_durable_started"):
            self.__dict__["_durable_started"] = True
            # Nothing restored by Tune: resume from the store, if it holds anything.
            if self.iteration == 0 and self.store.latest() is not None:
                self._load_from_store(self.store, None)
        return super().train()  # type: ignore[no-any-return]

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        staging = tempfile.mkdtemp(prefix="elastrain-tune-save-")
        try:
            self.save_state(staging)
            future = self.store.save_async(
                staging, step=self.iteration, metrics={"training_iteration": self.iteration}, staging="move"
            )
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        future.add_done_callback(_log_failure)
        return {"elastrain_store": self.store_uri, "step": self.iteration}

    def load_checkpoint(self, checkpoint: dict[str, Any] | None) -> None:
        """Load the checkpoint Tune names: this trial's own, or another trial's (PBT's exploit step)."""
        self.__dict__["_durable_started"] = True
        record = checkpoint or {}
        step = record.get("step")
        source = record.get("elastrain_store")
        if source is None or source == self.store_uri:
            self.store.wait()  # a save still in flight in this process commits first
            self._load_from_store(self.store, step if isinstance(step, int) else None)
            return
        from elastrain.durable import CheckpointStore

        with CheckpointStore(
            str(source), num_to_keep=None, storage_options=self.storage_options, sync_client=self.sync_client
        ) as other:
            self._load_from_store(other, step if isinstance(step, int) else None)

    def _load_from_store(self, store: Any, step: int | None) -> None:
        """Restore the checkpoint of ``step`` when it is committed, else the latest one; verified."""
        chosen = next((c for c in reversed(store.list()) if c.step == step), None) if step is not None else None
        with tempfile.TemporaryDirectory(prefix="elastrain-tune-restore-") as scratch:
            restored = store.restore(chosen, local_dir=scratch + "/state", fallback=True)
            logger.info("Trial %s loads %s (step %s).", self.trial_name, restored.uri, restored.step)
            self.load_state(scratch + "/state")

    def cleanup(self) -> None:
        store = self.__dict__.get("_durable_store")
        if store is not None:
            store.close()  # waits for the upload in flight and the collection after it


def _end_with_node() -> None:
    """The trial's process ends as soon as its node's raylet dies, not at Ray's next check up to a second later:
    Tune notices the lost trial, and restarts it elsewhere, that much sooner."""
    from elastrain.executor import watch_raylet

    watch_raylet()


def _log_failure(future: Any) -> None:
    error = future.exception()
    if error is not None:
        logger.warning("A checkpoint of this trial failed to save: %s", error)
