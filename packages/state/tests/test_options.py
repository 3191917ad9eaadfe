"""Bad options get an error that says what to change, before anything starts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from elastrain.state import SNAPSHOT_URI_ENV, RunTracker, StateActor, get_or_create_state_actor
from elastrain.state._private.options import resolve_persistence


@pytest.mark.parametrize("name", ["snapshot_interval_s", "io_timeout_s", "driver_check_interval_s"])
@pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf, True, "5"])
def test_seconds_must_be_positive_and_finite(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"{name} must be a positive, finite number of seconds"):
        get_or_create_state_actor(**{name: value})
    with pytest.raises(ValueError, match=f"{name} must be a positive, finite number of seconds"):
        StateActor(**{name: value}, persist=False)


@pytest.mark.parametrize("name", ["max_runs", "max_histories"])
@pytest.mark.parametrize("value", [0, -3, 2.5, True])
def test_max_runs_must_be_a_positive_int(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"{name} must be a positive int"):
        get_or_create_state_actor(**{name: value})


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("", "must be a folder or an fsspec URI"),
        (5, "must be a folder or an fsspec URI"),
        ("state/runs", "is a relative path"),
        ("nosuchfs://bucket/state", "unknown filesystem 'nosuchfs'"),
    ],
)
def test_bad_snapshot_uris(uri: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        get_or_create_state_actor(snapshot_uri=uri)


def test_persistence_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SNAPSHOT_URI_ENV, raising=False)
    assert resolve_persistence(None, None) == (None, True)  # on by default: the embedded folder
    assert resolve_persistence(None, False) == (None, False)
    assert resolve_persistence("/data/state", None) == ("/data/state", True)
    assert resolve_persistence("memory://state", True) == ("memory://state", True)
    with pytest.raises(ValueError, match="persist must be True, False or None"):
        resolve_persistence(None, "yes")
    with pytest.raises(ValueError, match="snapshot_uri was given with persist=False: drop one"):
        resolve_persistence("/data/state", False)
    monkeypatch.setenv(SNAPSHOT_URI_ENV, "off")
    assert resolve_persistence(None, None) == (None, False)
    assert resolve_persistence(None, True) == (None, True)  # the argument wins
    monkeypatch.setenv(SNAPSHOT_URI_ENV, "default")
    assert resolve_persistence(None, None) == (None, True)
    monkeypatch.setenv(SNAPSHOT_URI_ENV, "~/state")
    assert resolve_persistence(None, None)[0] == str(Path("~/state").expanduser())
    monkeypatch.setenv(SNAPSHOT_URI_ENV, "relative/state")
    with pytest.raises(ValueError, match=f"{SNAPSHOT_URI_ENV} 'relative/state' is a relative path"):
        get_or_create_state_actor()


def test_tracker_rejects_oversized_text() -> None:
    with pytest.raises(ValueError, match="name has 300 characters; use at most 256"):
        RunTracker("n" * 300)
    with pytest.raises(ValueError, match="run_id has 129 characters; use at most 128"):
        RunTracker("ok", run_id="r" * 129)
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        RunTracker("")
    tracker = RunTracker("ok", create_actor=False)  # bad metrics raise before anything is sent
    with pytest.raises(ValueError, match="at most 32 metrics"):
        tracker.report_metrics(step=1, **{f"m{n}": 1.0 for n in range(33)})
    with pytest.raises(ValueError, match="use at most 256"):
        tracker.report_metrics(step=1, **{"m" * 257: 1.0})
    for step in (-1, 2**63, 2.0, True):
        with pytest.raises(ValueError, match=r"step must be an int from 0 to 9223372036854775807 or None"):
            tracker.report_metrics(step=step, loss=1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="status must be 'CRASHED' or 'REMOVED', got 'DEAD'"):
        tracker.worker_exited({}, "DEAD")


def test_an_update_with_another_runs_view_is_refused() -> None:
    actor = StateActor(persist=False)
    view = {"name": "r", "id": "run-b", "job_id": "j", "start_time_ms": 1}
    with pytest.raises(ValueError, match="is run 'run-b': pass the same run's view"):
        actor.update_metrics("run-a", 1, {"loss": 0.5}, run=view)
