"""An elastrain executor job as one Ray Tune trial: its workers in the trial's placement group, the metrics they
``send()`` as the trial's results, and its elastic state persisted in a store of its own."""

from __future__ import annotations

import dataclasses
import logging
import numbers
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from elastrain.tune._private import worker_side
from elastrain.tune._private.errors import TuneIntegrationError
from elastrain.tune._private.resources import check_fits, trial_resources
from elastrain.tune._private.trial import TrialIdentity, TrialStorage

logger = logging.getLogger("elastrain.tune")


def executor_trainable(
    train_fn: Callable[[dict[str, Any]], Any],
    *,
    storage: str,
    num_workers: int | None = None,
    min_workers: int | None = None,
    max_workers: int | None = None,
    cpus_per_worker: float = 1,
    gpus_per_worker: float = 0,
    driver: Mapping[str, float] | None = None,
    strategy: str = "PACK",
    persist_every: int = 10,
    num_to_keep: int = 2,
    storage_options: Mapping[str, Any] | None = None,
    sync_client: Any = None,
    settings: Any = None,
    timeout_s: float = 60.0,
    name: str | None = None,
    sharded: bool = False,
) -> type:
    """A Tune ``Trainable`` class that runs ``train_fn(config)`` on an elastrain executor job per trial.

    ``train_fn`` runs on every worker, as with ``RayExecutor.run``: an elastic one uses ``elastic.run`` and a
    state, and calls ``state.persist_with(elastrain.tune.trial_persistence())`` so that its committed state goes
    to the trial's store, ``<storage>/<experiment>/<trial id>``, every ``persist_every`` commits, keeping
    ``num_to_keep``. What workers ``send()`` with at least one number becomes the trial's next result (the newest
    one when several arrived since Tune last asked); send from rank 0 only, or give a ``step``: a result whose
    step was already reported is dropped.

    Sizes and resources are :func:`trial_resources`'. An elastic trial (``min_workers``/``max_workers``) that
    loses workers or a node goes on with the rest, and grows back when Ray places the lost bundles again; Tune
    never sees it fail. When Tune does restart it (its own process lost, every worker gone), it resumes from the
    latest state in its store, which each of its first workers starts loading as soon as it starts. ``settings`` is a
    ``RayExecutor.create_settings(...)``; ``timeout_s`` bounds opening the store when the trial starts.
    ``sync_client`` (an elastrain-durable ``SyncClient``, such as ``ArrowSyncClient``) replaces ``storage_options``.

    ``sharded=True`` is for a job whose state is an ``elastic.ShardedTorchState`` (FSDP2): the trial's
    persistence is then a ``ShardedStatePersistence``, every rank writes its part of each persisted commit, and a
    restarted trial loads the latest at whatever size it restarts with.
    """
    if not callable(train_fn):
        raise TypeError(f"train_fn must be a function taking the trial's config, got {train_fn!r}.")
    resources = trial_resources(
        num_workers=num_workers,
        min_workers=min_workers,
        max_workers=max_workers,
        cpus_per_worker=cpus_per_worker,
        gpus_per_worker=gpus_per_worker,
        driver=driver,
        strategy=strategy,
    )
    if not isinstance(sharded, bool):
        raise TypeError(f"sharded is True (an elastic.ShardedTorchState) or False, got {sharded!r}.")
    persistence_type(sharded)(
        storage, every=persist_every, num_to_keep=num_to_keep, storage_options=storage_options, sync_client=sync_client
    ).close()
    executor_options: dict[str, Any] = {"cpus_per_worker": cpus_per_worker, "use_gpu": bool(gpus_per_worker)}
    if gpus_per_worker:
        executor_options["gpus_per_worker"] = gpus_per_worker
    if num_workers is not None:
        executor_options["num_workers"] = num_workers
    else:
        executor_options.update(min_workers=min_workers, max_workers=max_workers)
    attributes = {
        "_et_train_fn": staticmethod(train_fn),
        "_et_resources": resources,
        "_et_executor_options": executor_options,
        "_et_settings": settings,
        "_et_storage": storage,
        "_et_storage_options": dict(storage_options or {}),
        "_et_sync_client": sync_client,
        "_et_persist_every": persist_every,
        "_et_num_to_keep": num_to_keep,
        "_et_timeout_s": timeout_s,
        "_et_sharded": sharded,
        "__module__": getattr(train_fn, "__module__", __name__),
    }
    class_name = name or str(getattr(train_fn, "__name__", "executor_trial"))
    return type(class_name, (ExecutorTrainable,), attributes)


def persistence_type(sharded: bool) -> type:
    """The persistence a trial's workers write its state with: whole (rank 0) or sharded (every rank)."""
    if not sharded:
        from elastrain.durable import StatePersistence

        return StatePersistence
    try:
        from elastrain.durable import ShardedStatePersistence
    except ImportError:
        raise ImportError(
            "executor_trainable(sharded=True) needs elastrain-durable's ShardedStatePersistence, from its release "
            "after 0.1.0; upgrade it: pip install -U elastrain-durable elastrain-executor"
        ) from None
    return ShardedStatePersistence


def _trainable_base() -> type:
    from ray import tune

    return tune.Trainable


class ExecutorTrainable(_trainable_base()):  # type: ignore[misc]
    """Base of the classes :func:`executor_trainable` makes; not used directly."""

    _et_train_fn: Callable[[dict[str, Any]], Any]
    _et_resources: Any
    _et_executor_options: dict[str, Any]
    _et_settings: Any
    _et_storage: str
    _et_storage_options: dict[str, Any]
    _et_sync_client: Any
    _et_persist_every: int
    _et_num_to_keep: int
    _et_sharded: bool
    _et_timeout_s: float

    @classmethod
    def default_resource_request(cls, config: dict[str, Any]) -> Any:
        check_fits(cls._et_resources.bundles, cls._et_resources.strategy)
        return cls._et_resources

    def setup(self, config: dict[str, Any]) -> None:
        from elastrain.executor import RayExecutor, watch_raylet

        watch_raylet()  # lost with its node, the trial's process ends at once: Tune restarts it that much sooner

        self._et_store_place = TrialStorage(
            self._et_storage,
            TrialIdentity.of_trainable(self),
            self._et_storage_options,
            self._et_timeout_s,
            self._et_sync_client,
        ).open(hold_in_background=True)
        persistence = persistence_type(self._et_sharded)(
            self._et_store_place.uri,
            every=self._et_persist_every,
            num_to_keep=self._et_num_to_keep,
            storage_options=self._et_storage_options or None,
            sync_client=self._et_sync_client,
        )
        self._et_results: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._et_last_result: dict[str, Any] = {}
        self._et_last_step = -1
        settings, options = self._executor_settings()
        self._et_executor = RayExecutor(settings, use_current_placement_group=True, **options)
        self._et_executor.start()
        self._et_store_place.wait_held()  # before any worker may write
        self._et_thread = threading.Thread(
            target=self._run, args=(dict(config), persistence), name="elastrain-tune-trial", daemon=True
        )
        self._et_thread.start()

    def _executor_settings(self) -> tuple[Any, dict[str, Any]]:
        """The executor's settings; an elastic job's workers go into the trial's worker bundles, never into the
        bundle of the trial's own process."""
        from elastrain.executor import RayExecutor

        settings = self._et_settings if self._et_settings is not None else RayExecutor.create_settings()
        options = dict(self._et_executor_options)
        if "min_workers" not in options:
            return settings, options
        from ray.util.placement_group import get_current_placement_group

        from elastrain.discovery import PlacementGroupHostDiscovery

        group = get_current_placement_group()
        if group is None:
            raise TuneIntegrationError(
                "An executor trial runs inside a Tune trial's placement group; run it with tune.Tuner."
            )
        discovery = PlacementGroupHostDiscovery(
            group,
            use_gpu=options["use_gpu"],
            cpus_per_worker=options["cpus_per_worker"],
            gpus_per_worker=options.get("gpus_per_worker", 1),
            exclude_bundles=set() if self._et_resources.head_bundle_is_empty else {0},
        )
        options["override_discovery"] = False
        return dataclasses.replace(settings, discovery=discovery), options

    def _run(self, config: dict[str, Any], persistence: Any) -> None:
        try:
            values = self._et_executor.run(
                worker_side.run_trial_function,
                args=(type(self)._et_train_fn, config, persistence, time.time()),
                callbacks=[self._on_message],
            )
        except BaseException as error:  # handed to step(), which Tune calls next
            self._et_results.put(("error", error))
        else:
            self._et_results.put(("done", values))

    def _on_message(self, message: dict[str, Any]) -> None:
        result = _as_result(message)
        if result is None:
            return
        step = result.get("step")
        if isinstance(step, int) and not isinstance(step, bool):
            if step <= self._et_last_step:
                return  # another rank's report of the same step
            self._et_last_step = step
        self._et_results.put(("result", result))

    def step(self) -> dict[str, Any]:
        kind, value = self._et_results.get()
        while kind == "result":  # the newest of what arrived: schedulers decide on the latest numbers
            self._et_last_result = value
            try:
                kind, value = self._et_results.get_nowait()
            except queue.Empty:
                return dict(self._et_last_result)
        if kind == "done":  # rank 0's return value, when it is a dict, joins the last result
            final = value[0] if value and isinstance(value[0], Mapping) else {}
            return {**self._et_last_result, **_flat(final), "done": True}
        raise value

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        """Tune's checkpoint of this trial names its store; the state itself is persisted by the workers."""
        return {"elastrain_store": self._et_store_place.uri}

    def load_checkpoint(self, checkpoint: dict[str, Any] | None) -> None:
        store = (checkpoint or {}).get("elastrain_store")
        if store is not None and store != self._et_store_place.uri:
            raise TuneIntegrationError(
                f"This trial ({self._et_store_place.uri}) was asked to load the checkpoint of another trial "
                f"({store}), as PBT's exploit step does. Executor trials keep their state in their own store and "
                "cannot take another trial's yet: use a scheduler that stops or pauses trials (ASHA, HyperBand, "
                "median stopping)."
            )

    def cleanup(self) -> None:
        executor = getattr(self, "_et_executor", None)
        if executor is not None:
            executor.shutdown()
        place = getattr(self, "_et_store_place", None)
        if place is not None:
            place.release()


def _as_result(message: Mapping[str, Any]) -> dict[str, Any] | None:
    """The message as a Tune result when it holds a number (a bool is not one), else None."""
    if not any(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in message.values()):
        return None
    return _flat(message)


def _flat(values: Mapping[Any, Any]) -> dict[str, Any]:
    """What Tune can keep of ``values``: numbers, text, None and lists of those, under string keys. Tensors,
    arrays and nested dicts are left out (Tune refuses tensors, and its loggers expect flat results)."""
    result: dict[str, Any] = {}
    for key, value in values.items():
        if not isinstance(key, str):
            continue
        if _scalar(value):
            result[key] = _plain(value)
        elif isinstance(value, (list, tuple)) and all(_scalar(item) for item in value):
            result[key] = [_plain(item) for item in value]
    return result


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, str, numbers.Real))


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value  # numpy scalars
