"""Which trial this is, and the store it owns under a base URI: ``<base>/<experiment>/<trial id>``.

Opening a trial's store checks, with a deadline, that:

- the experiment's folder belongs to this experiment (``experiment.json`` names where Tune keeps the experiment;
  another experiment of the same name elsewhere is refused, a restore of this one is welcome);
- the trial id is this trial's (``trials/<id>.json`` names the trial's folder, which Tune dates when it
  creates the trial and keeps across restarts and restores; a fresh trial that got the same id is refused);
- no other live trial in the Ray cluster writes the same store: a named Ray actor, owned by the trial's
  process, holds it and dies with that process, so a restarted trial takes it over once Ray has noticed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import logging
import re
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from elastrain.tune._private.errors import StorageUnreachableError, StoreInUseError, TrialIdReusedError

logger = logging.getLogger("elastrain.tune")
T = TypeVar("T")

_LOCK_NAMESPACE = "elastrain-tune"
# How long a trial waits for the holder of its store's lock to go (a predecessor whose process Ray is still
# declaring dead) before it decides that another live trial holds it.
LOCK_WAIT_S = 30.0
# A started holder that does not answer within this is gone (its node lost); a live one answers in
# milliseconds, and well within this even on a busy node.
HOLDER_PING_S = 1.0
# How long a trial waits for Ray to start the actor that holds its store.
HOLDER_START_S = 60.0


@dataclass(frozen=True)
class TrialIdentity:
    experiment: str  # Tune's experiment folder name
    experiment_path: str  # where Tune keeps the experiment (filesystem type and path)
    trial_id: str
    trial_name: str
    trial_dir_name: str  # dated by Tune when the trial is created; kept across restarts and restores

    @classmethod
    def of_trainable(cls, trainable: Any) -> TrialIdentity:
        storage = getattr(trainable, "_storage", None)
        if storage is None:
            raise RuntimeError(
                "This Trainable runs outside Ray Tune (it has no storage context); run it with tune.Tuner."
            )
        return cls._from_storage(storage, trainable.trial_id, trainable.trial_name)

    @classmethod
    def current(cls) -> TrialIdentity:
        """The trial of the running Tune function trainable."""
        from ray import tune

        context = tune.get_context()
        with warnings.catch_warnings():  # outside a trial Ray warns, then answers None: the error below says more
            warnings.simplefilter("ignore")
            trial_id = context.get_trial_id()
        if trial_id is None:
            raise RuntimeError(
                "elastrain.tune.trial_store() runs inside a Tune trial; call it from the trainable function."
            )
        return cls._from_storage(context.get_storage(), trial_id, context.get_trial_name())

    @classmethod
    def _from_storage(cls, storage: Any, trial_id: str, trial_name: str) -> TrialIdentity:
        filesystem = getattr(storage.storage_filesystem, "type_name", "local")
        return cls(
            experiment=storage.experiment_dir_name,
            experiment_path=f"{filesystem}:{storage.experiment_fs_path}",
            trial_id=trial_id,
            trial_name=trial_name,
            trial_dir_name=storage.trial_dir_name or trial_name,
        )


class TrialStorage:
    """A trial's place under the base URI, opened and held (see the module's docstring)."""

    def __init__(
        self,
        base_uri: str,
        identity: TrialIdentity,
        storage_options: Mapping[str, Any] | None,
        timeout_s: float,
        sync_client: Any = None,
    ) -> None:
        if not isinstance(base_uri, str) or not base_uri:
            raise ValueError(
                f"storage must be a URI or path such as 's3://bucket/tune' or '/mnt/ckpt', got {base_uri!r}."
            )
        self.identity = identity
        self.base_uri = base_uri.rstrip("/")
        self.experiment_uri = f"{self.base_uri}/{identity.experiment}"
        self.uri = f"{self.experiment_uri}/{identity.trial_id}"
        self.storage_options = dict(storage_options or {})
        self.sync_client = sync_client  # an elastrain-durable SyncClient: the store's own, for the markers too
        self.timeout_s = timeout_s
        self._lock: Any = None
        self._checked: concurrent.futures.Future[None] | None = None
        self._holding: concurrent.futures.Future[Any] | None = None

    def open(self, *, check_in_background: bool = False, hold_in_background: bool = False) -> TrialStorage:
        """Check the folder, then take the store's lock. Either can happen in a thread, so that a restarted trial
        gets on with building its model: readers then call :meth:`wait_checked` before their first read, writers
        :meth:`wait_held` before their first write (each raises what went wrong)."""
        checked: concurrent.futures.Future[None] = concurrent.futures.Future()
        holding: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._checked, self._holding = checked, holding
        if check_in_background:
            threading.Thread(
                target=self._open, args=(checked, holding), name="elastrain-tune-open", daemon=True
            ).start()
            return self
        self._check(checked)
        self.wait_checked()
        if hold_in_background:
            threading.Thread(target=self._hold_into, args=(holding,), name="elastrain-tune-lock", daemon=True).start()
        else:
            self._hold_into(holding)
            self.wait_held()
        return self

    def _open(self, checked: concurrent.futures.Future[None], holding: concurrent.futures.Future[Any]) -> None:
        self._check(checked)
        failure = checked.exception()
        if failure is None:
            self._hold_into(holding)
        else:
            holding.set_exception(failure)

    def _check(self, checked: concurrent.futures.Future[None]) -> None:
        try:
            self._with_deadline("checking its folder", self._check_markers)
            checked.set_result(None)
        except BaseException as error:  # raised by wait_checked(), to whoever reads first
            checked.set_exception(error)

    def _hold_into(self, holding: concurrent.futures.Future[Any]) -> None:
        try:
            holding.set_result(_hold(self.uri, self.identity))
        except BaseException as error:  # raised by wait_held(), to whoever writes first
            holding.set_exception(error)

    def wait_checked(self) -> None:
        """Return once the folder is known to be this trial's; raise why it is not, or why it cannot be read."""
        if self._checked is None:
            raise RuntimeError("This trial's store is not open (or was released).")
        self._checked.result()

    def wait_held(self) -> None:
        """Return once this trial holds its store; raise why it cannot (another live trial holds it)."""
        self.wait_checked()
        if self._holding is None:
            raise RuntimeError("This trial's store is not open (or was released).")
        lock = self._holding.result()
        # Looked up at every write: a trial that took this one's holder for a lost one (it did not answer in
        # time) has replaced it, and two trials must never write one store.
        if not _names(self.uri, lock):
            raise _held_elsewhere(self.uri, self.identity, "took it over from this one")
        self._lock = lock

    def release(self) -> None:
        holding = self._holding
        if holding is None:
            return
        holding.add_done_callback(_free)  # now, or once a hold still under way ends: never left behind
        self._checked = self._holding = None
        self._lock = None

    # -- markers --------------------------------------------------------------------------------------------------

    def _check_markers(self) -> None:
        client = self._client()
        root = self.experiment_uri
        experiment = {"experiment": self.identity.experiment, "experiment_path": self.identity.experiment_path}
        found = self._read_json(client, f"{root}/experiment.json")
        if found is None:
            self._write_json(client, f"{root}/experiment.json", experiment)
        elif found.get("experiment_path") != self.identity.experiment_path:
            raise StoreInUseError(
                f"{self.experiment_uri} holds the trials of another experiment named {self.identity.experiment!r} "
                f"(kept by Tune at {found.get('experiment_path')!r}; "
                f"this one is at {self.identity.experiment_path!r}). "
                "Give this experiment another name (tune.RunConfig(name=...)) or another base URI, or delete the old "
                "folder if its checkpoints are no longer wanted."
            )
        trial = {
            "trial_id": self.identity.trial_id,
            "trial_name": self.identity.trial_name,
            "trial_dir_name": self.identity.trial_dir_name,
        }
        marker = f"{root}/trials/{self.identity.trial_id}.json"
        found = self._read_json(client, marker)
        if found is None:
            self._write_json(client, marker, trial)
        elif found.get("trial_dir_name") != self.identity.trial_dir_name:
            raise TrialIdReusedError(
                f"Trial id {self.identity.trial_id!r} already belongs to trial {found.get('trial_dir_name')!r} in "
                f"{self.experiment_uri}; this trial ({self.identity.trial_dir_name!r}) would resume from its "
                "checkpoints. "
                "Trial ids are reused when an experiment is started again under the same name (or with a fixed "
                "trial id prefix): restore it with tune.Tuner.restore(), or give the new run another name or base "
                "URI."
            )

    def _client(self) -> Any:
        """The store's client where one was given, else the one a store on this URI would use (on local folders
        it writes to a temporary name and renames: a marker is never seen half-written)."""
        if self.sync_client is not None:
            return self.sync_client
        from elastrain.durable import CheckpointStore

        return CheckpointStore(self.experiment_uri, storage_options=self.storage_options or None).client

    def _read_json(self, client: Any, uri: str) -> dict[str, Any] | None:
        try:
            value = json.loads(client.read_bytes(uri, timeout_s=self.timeout_s))
        except FileNotFoundError:
            return None
        return value if isinstance(value, dict) else {}

    def _write_json(self, client: Any, uri: str, value: dict[str, Any]) -> None:
        client.write_bytes(uri, json.dumps(value, indent=1).encode(), timeout_s=self.timeout_s)

    def _with_deadline(self, what: str, call: Callable[[], T]) -> T:
        """Run ``call`` in a daemon thread and give up after ``timeout_s``: an unreachable endpoint can make a
        storage client retry for minutes, and a hung call must not keep the process from exiting."""
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            try:
                outcome["value"] = call()
            except BaseException as error:  # handed to the caller below
                outcome["error"] = error
            finally:
                done.set()

        threading.Thread(target=target, name="elastrain-tune-storage", daemon=True).start()
        if not done.wait(self.timeout_s):
            raise StorageUnreachableError(
                f"Trial {self.identity.trial_name} could not reach its store {self.uri} within "
                f"timeout_s={self.timeout_s:g} while {what}. Check the URI, the endpoint and the credentials "
                "(storage_options), or raise timeout_s."
            )
        error = outcome.get("error")
        if isinstance(error, (StoreInUseError, TrialIdReusedError)):
            raise error
        if error is not None:
            raise StorageUnreachableError(
                f"Trial {self.identity.trial_name} could not use its store {self.uri} while {what}: "
                f"{type(error).__name__}: {error}. Check the URI, the endpoint and the credentials (storage_options)."
            ) from error
        return outcome["value"]  # type: ignore[no-any-return]


class _StoreLock:
    """Holds a trial's store by existing under a name derived from the store's URI.

    Created with the URI, which it shows in Ray's actor list. That argument also matters: Ray 2.60 delivers the
    answer to an actor's first call 85-140 ms late when neither the call nor the actor's creation had arguments.
    """

    def __init__(self, uri: str) -> None:
        self.uri = uri

    def __repr__(self) -> str:
        return f"StoreLock({re.sub(r'//[^/@]*@', '//', self.uri)})"  # Ray shows it: never credentials in a URI

    def holding(self) -> bool:
        return True


def _hold(uri: str, identity: TrialIdentity) -> Any:
    """Create the named actor that holds ``uri`` and return it once it answers.

    When the name is taken, the holder is asked whether it still lives: one that answers is another live trial
    (waited for up to ``LOCK_WAIT_S``, since a predecessor's lock goes a moment after its process); one that does
    not is a predecessor lost with its node, which Ray declares dead only some seconds later, so it is killed
    (freeing the name at once) and the trial that Tune restarted goes on without waiting for that.

    A holder that Ray has not started yet (a worker process can take seconds on a busy node) looks lost too. Its
    trial therefore holds the store only once its holder answers; a trial whose holder was removed before that
    lost a race to a contender starting its own, and from then on waits for that one instead of removing it.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    name = _lock_name(uri)
    here = ray.get_runtime_context().get_node_id()
    deadline = time.monotonic() + LOCK_WAIT_S
    raced = False
    while True:
        try:
            lock: Any = (
                ray.remote(_StoreLock)
                .options(
                    name=name,
                    namespace=_LOCK_NAMESPACE,
                    num_cpus=0,
                    max_restarts=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
                )
                .remote(uri)
            )
        except ValueError:  # the name is taken
            if not _holder_lives(name, remove_silent=not raced):
                continue
            if time.monotonic() > deadline:
                raise _held_elsewhere(uri, identity, f"still held it after {LOCK_WAIT_S:g} s") from None
            time.sleep(0.2)
            continue
        if _started(lock, uri, identity):
            return lock
        if time.monotonic() > deadline:
            raise _held_elsewhere(uri, identity, "removed this trial's claim while it was starting") from None
        raced = True


def _started(lock: Any, uri: str, identity: TrialIdentity) -> bool:
    """Whether a freshly created holder answers (False: it was removed first); raise if Ray never starts it."""
    import ray

    deadline = time.monotonic() + HOLDER_START_S
    while True:
        try:
            ray.get(lock.holding.remote(), timeout=max(deadline - time.monotonic(), 0.001))
            return True
        except ray.exceptions.ActorUnavailableError:  # unreachable for a moment, not dead: ask again
            if time.monotonic() < deadline:
                time.sleep(0.2)
                continue
        except ray.exceptions.RayActorError:
            return False
        except ray.exceptions.GetTimeoutError:
            pass
        ray.kill(lock, no_restart=True)
        raise RuntimeError(
            f"Ray did not start the actor that holds the store of trial {identity.trial_id!r} ({uri}) within "
            f"{HOLDER_START_S:g} s. It needs no CPU, only a worker process on this node: check the node with "
            "`ray status` and its free memory."
        )


def _holder_lives(name: str, *, remove_silent: bool) -> bool:
    """Whether the actor holding ``name`` is there: it answers within ``HOLDER_PING_S``, or it is silent and
    ``remove_silent`` is off. A dead one, and a silent one when ``remove_silent`` is on, is killed."""
    import ray

    try:
        holder: Any = ray.get_actor(name, namespace=_LOCK_NAMESPACE)
    except ValueError:
        return False  # gone meanwhile: try again
    answer: Any = holder.holding.remote()
    try:
        ray.get(answer, timeout=HOLDER_PING_S)
    except (ray.exceptions.GetTimeoutError, ray.exceptions.ActorUnavailableError):
        if not remove_silent:
            return True
        logger.info("The previous holder of this trial's store does not answer (its node was lost); taking over.")
        ray.kill(holder, no_restart=True)
        return False
    except ray.exceptions.RayActorError:
        ray.kill(holder, no_restart=True)
        return False
    return True


def _lock_name(uri: str) -> str:
    return "store-" + hashlib.sha256(uri.encode()).hexdigest()[:32]


def _names(uri: str, lock: Any) -> bool:
    """Whether ``lock`` is still the actor named as the holder of ``uri``."""
    import ray

    try:
        return bool(ray.get_actor(_lock_name(uri), namespace=_LOCK_NAMESPACE) == lock)
    except ValueError:
        return False


def _held_elsewhere(uri: str, identity: TrialIdentity, what: str) -> TrialIdReusedError:
    return TrialIdReusedError(
        f"Another live trial in this Ray cluster writes {uri} (the store of trial {identity.trial_id!r}); it {what}. "
        "Two experiments restored from the same state, or two runs with the same trial ids, must not run at once: "
        "stop the other one."
    )


def _free(holding: concurrent.futures.Future[Any]) -> None:
    """Kill the holder a hold ended with (none if it failed)."""
    if holding.cancelled() or holding.exception() is not None:
        return
    import ray

    with contextlib.suppress(Exception):  # already gone
        ray.kill(holding.result(), no_restart=True)
