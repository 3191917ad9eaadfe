"""A trial's store under the base URI: this experiment's, this trial's, held by one live trial, reachable."""

from __future__ import annotations

import concurrent.futures
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from elastrain.tune import StorageUnreachableError, StoreInUseError, TrialIdReusedError
from elastrain.tune._private import trial as trial_module
from elastrain.tune._private.trial import TrialIdentity, TrialStorage
from elastrain_testutils.ray_testing import local_ray
from elastrain_testutils.storage_servers import SeaweedS3
from elastrain_testutils.waiting import wait_until


@pytest.fixture(scope="module", autouse=True)
def ray_instance() -> Iterator[None]:
    with local_ray(num_cpus=1):
        yield


def identity(
    trial_id: str = "abc12_00000", *, experiment_path: str = "local:/results/exp", dated: str = "t_2026-12-03"
) -> TrialIdentity:
    return TrialIdentity("exp", experiment_path, trial_id, f"train_{trial_id}", f"train_{trial_id}_{dated}")


def test_a_trial_gets_its_own_store_and_gets_it_back_after_a_restart(tmp_path: Path) -> None:
    first = TrialStorage(str(tmp_path), identity(), None, 30).open()
    assert first.uri == f"{tmp_path}/exp/abc12_00000"
    first.release()
    again = TrialStorage(str(tmp_path), identity(), None, 30).open()  # a restart: same trial, same folder
    assert again.uri == first.uri
    again.release()


def test_another_experiment_of_the_same_name_is_refused(tmp_path: Path) -> None:
    TrialStorage(str(tmp_path), identity(), None, 30).open().release()
    with pytest.raises(StoreInUseError) as raised:
        TrialStorage(str(tmp_path), identity("def34_00000", experiment_path="local:/other/exp"), None, 30).open()
    assert "another experiment named 'exp'" in str(raised.value)
    assert "local:/other/exp" in str(raised.value)


def test_a_fresh_trial_with_a_used_id_is_refused(tmp_path: Path) -> None:
    TrialStorage(str(tmp_path), identity(), None, 30).open().release()
    with pytest.raises(TrialIdReusedError) as raised:
        TrialStorage(str(tmp_path), identity(dated="t_2026-12-04"), None, 30).open()
    assert "Trial id 'abc12_00000' already belongs to trial 'train_abc12_00000_t_2026-12-03'" in str(raised.value)
    assert "Tuner.restore" in str(raised.value)


def test_two_live_trials_never_write_one_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trial_module, "LOCK_WAIT_S", 1.0)
    holder = TrialStorage(str(tmp_path), identity(), None, 30).open()
    with pytest.raises(TrialIdReusedError) as raised:
        TrialStorage(str(tmp_path), identity(), None, 30).open()
    assert "Another live trial in this Ray cluster writes" in str(raised.value)
    holder.release()  # once the holder is gone, the next one takes over
    TrialStorage(str(tmp_path), identity(), None, 30).open().release()


@pytest.mark.parametrize("start_s", [0.0, 2.0], ids=["quick", "slower-than-a-ping"])
def test_of_two_trials_opening_one_store_at_once_exactly_one_holds_it(
    start_s: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each asks about the other's holder while Ray may still be starting it, which on a busy node takes longer
    # than a lost holder is given to answer: a trial whose holder is removed before it starts must not go on as
    # if it held the store, nor remove the other's in turn.
    monkeypatch.setattr(trial_module, "LOCK_WAIT_S", 1.0)
    monkeypatch.setattr(trial_module, "_StoreLock", _starting_after(start_s))
    trials = [TrialStorage(str(tmp_path), identity(), None, 30) for _ in range(2)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        opened = [pool.submit(trial.open) for trial in trials]
        outcomes = [future.exception(timeout=60) for future in opened]
    refused = [error for error in outcomes if error is not None]
    assert len(refused) == 1, outcomes
    assert isinstance(refused[0], TrialIdReusedError)
    (holder,) = (trial for trial, error in zip(trials, outcomes, strict=True) if error is None)
    assert ray.get(holder._lock.holding.remote(), timeout=30)  # the one that holds has the live holder
    holder.release()


def test_a_trial_whose_holder_was_replaced_is_refused_at_its_next_write(tmp_path: Path) -> None:
    """What a second trial does when the holder does not answer in time: kill it and hold the store itself."""
    first = TrialStorage(str(tmp_path), identity(), None, 30).open()
    name = trial_module._lock_name(first.uri)
    ray.kill(first._lock, no_restart=True)
    wait_until(lambda: _unnamed(name), timeout_s=30, what="the killed holder's name to be free")
    holder = ray.remote(trial_module._StoreLock).options(name=name, namespace=trial_module._LOCK_NAMESPACE)
    other = holder.remote(first.uri)
    with pytest.raises(TrialIdReusedError, match="took it over from this one"):
        first.wait_held()
    ray.kill(other, no_restart=True)


def test_a_release_during_a_hold_frees_the_store_once_the_hold_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trial_module, "_StoreLock", _starting_after(2.0))
    storage = TrialStorage(str(tmp_path), identity(), None, 30).open(hold_in_background=True)
    name = trial_module._lock_name(storage.uri)
    storage.release()  # returns at once; the holder still starting is killed when its hold ends
    wait_until(lambda: not _unnamed(name), timeout_s=30, what="the hold to create its holder")
    wait_until(lambda: _unnamed(name), timeout_s=30, what="the released holder to go")


def _unnamed(name: str) -> bool:
    try:
        ray.get_actor(name, namespace=trial_module._LOCK_NAMESPACE)
    except ValueError:
        return True
    return False


def _starting_after(seconds: float) -> type:
    """A store holder whose actor takes ``seconds`` to start (defined here, so Ray ships it by value)."""

    class SlowToStart(trial_module._StoreLock):
        def __init__(self, uri: str) -> None:
            time.sleep(seconds)
            super().__init__(uri)

    return SlowToStart


def test_storage_that_cannot_be_reached_fails_clearly_within_its_deadline(seaweed: SeaweedS3) -> None:
    options = _unreachable(seaweed)
    with pytest.raises(StorageUnreachableError) as raised:
        TrialStorage("s3://bucket/tune", identity(), options, 5).open()
    assert "could not" in str(raised.value)
    assert "s3://bucket/tune/exp/abc12_00000" in str(raised.value)
    assert "Check the URI, the endpoint and the credentials" in str(raised.value)


def _unreachable(seaweed: SeaweedS3) -> dict[str, Any]:
    """The server's S3 options with its endpoint moved to a port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    options: dict[str, Any] = seaweed.storage_options()
    options["client_kwargs"] = {"endpoint_url": f"http://127.0.0.1:{closed}"}
    return options


@pytest.mark.parametrize("base", ["", None, 3])
def test_a_base_uri_that_is_not_one_is_refused(base: Any) -> None:
    with pytest.raises(ValueError, match="storage must be a URI or path"):
        TrialStorage(base, identity(), None, 30)


class _Unresponsive:
    """A lock holder whose process no longer answers (as when its node was lost and Ray does not know yet)."""

    def holding(self) -> bool:
        import time

        time.sleep(60)
        return True


def test_a_holder_that_no_longer_answers_is_taken_over_at_once(tmp_path: Path) -> None:
    import hashlib
    import time

    import ray

    place = TrialStorage(str(tmp_path), identity(), None, 30)
    name = "store-" + hashlib.sha256(place.uri.encode()).hexdigest()[:32]
    stale = ray.remote(_Unresponsive).options(name=name, namespace="elastrain-tune", num_cpus=0).remote()
    ray.get(stale.__ray_ready__.remote(), timeout=60)
    started = time.monotonic()
    place.open()
    assert time.monotonic() - started < trial_module.LOCK_WAIT_S / 2  # did not wait for the stale holder
    place.release()


def test_a_background_open_reports_its_failure_to_the_first_reader_and_writer(seaweed: SeaweedS3) -> None:
    options = _unreachable(seaweed)
    place = TrialStorage("s3://bucket/tune", identity(), options, 5).open(check_in_background=True)
    with pytest.raises(StorageUnreachableError, match="could not"):
        place.wait_checked()
    with pytest.raises(StorageUnreachableError, match="could not"):
        place.wait_held()
    place.release()


def test_a_background_open_holds_the_store_once_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trial_module, "LOCK_WAIT_S", 0.5)
    place = TrialStorage(str(tmp_path), identity(), None, 30).open(check_in_background=True)
    place.wait_held()
    assert (tmp_path / "exp" / "trials" / "abc12_00000.json").is_file()
    second = TrialStorage(str(tmp_path), identity(), None, 30)
    with pytest.raises(TrialIdReusedError):  # held: a second live opener is refused once its wait runs out
        second.open()
    place.release()
