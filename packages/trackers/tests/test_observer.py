"""The run handle turns the executor's calls into tracker calls, in order, and never waits on a tracker."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from conftest import play_a_run_with_a_crash, run_record

from elastrain.trackers import Event, Point, RunInfo, TrackersObserver, use


class Recording:
    """A tracker that keeps every call it gets."""

    name = "recording"

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.runs: list[RunInfo] = []

    def open(self, run: RunInfo) -> Recording:
        self.runs.append(run)
        return self

    def metrics(self, points: Sequence[Point]) -> None:
        self.calls += [("metric", (p.step, p.values["loss"])) for p in points]

    def world_size(self, size: int, resets: int, step: int | None, time_ms: int) -> None:
        self.calls.append(("world_size", (size, resets, step)))

    def event(self, event: Event) -> None:
        self.calls.append(("event", (event.kind, event.step, event.text)))

    def end(self, status: str, detail: str | None) -> None:
        self.calls.append(("end", (status, detail)))


def test_no_tracker_in_use_observes_nothing() -> None:
    assert TrackersObserver().start_run(run_record()) is None


def test_a_run_reaches_the_tracker_in_order_with_its_resets_and_exits() -> None:
    tracker = Recording()
    use(tracker)
    handle = TrackersObserver().start_run(run_record())
    assert handle is not None
    play_a_run_with_a_crash(handle)

    run = tracker.runs[0]
    assert (run.id, run.name, run.params) == ("0123456789abcdef", "train", {"world_size": 2, "min_workers": 1,
                                                                          "max_workers": 2})  # fmt: skip
    kinds = [kind for kind, _ in tracker.calls]
    assert kinds[0] == "world_size"
    assert kinds[-1] == "end"
    assert tracker.calls[0] == ("world_size", (2, 0, None))
    assert [args for kind, args in tracker.calls if kind == "world_size"][1:] == [(1, 1, 6), (2, 2, 7)]
    events = [args for kind, args in tracker.calls if kind == "event"]
    assert events[0] == ("worker_exited", 6, "worker 1 on host-1 crashed: SIGKILL")
    assert [e[:2] for e in events[1:]] == [("reset", 6), ("reset", 7)]
    assert [args[0] for kind, args in tracker.calls if kind == "metric"] == [*range(7), 5, 6, 7, 8, 9]
    assert tracker.calls[-1] == ("end", ("FINISHED", None))


class Stalled(Recording):
    """A tracker whose every call waits until the test lets it go: a server that stopped answering."""

    name = "stalled"

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()

    def metrics(self, points: Sequence[Point]) -> None:
        self.go.wait()


def test_a_stalled_tracker_never_holds_the_run_and_says_once_what_it_dropped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("ELASTRAIN_TRACKERS_CLOSE_S", "0.2")
    stalled, healthy = Stalled(), Recording()
    use(stalled, healthy)
    handle = TrackersObserver().start_run(run_record())
    assert handle is not None
    with caplog.at_level(logging.WARNING, logger="elastrain.trackers"):
        for step in range(5_000):  # five times what a tracker's queue holds: every call returns at once
            handle.metrics([{"step": step, "values": {"loss": 1.0}, "time_ms": step}])
        handle.finished()  # waits at most ELASTRAIN_TRACKERS_CLOSE_S for the stalled tracker
    stalled.go.set()

    behind = [r for r in caplog.records if "stalled is behind" in r.getMessage()]
    assert len(behind) == 1, "one line when the tracker falls behind, not one per dropped call"
    assert any("stalled did not take the end of the run" in r.getMessage() for r in caplog.records)
    # The healthy tracker got everything, the stalled one held nobody up.
    assert len([c for c in healthy.calls if c[0] == "metric"]) == 5_000
    assert healthy.calls[-1] == ("end", ("FINISHED", None))


def test_a_tracker_that_fails_is_said_once_and_the_others_go_on(caplog: pytest.LogCaptureFixture) -> None:
    class Failing(Recording):
        name = "failing"

        def metrics(self, points: Sequence[Point]) -> None:
            raise ConnectionError("tracking server gone")

    failing, healthy = Failing(), Recording()
    use(failing, healthy)
    handle = TrackersObserver().start_run(run_record())
    assert handle is not None
    with caplog.at_level(logging.WARNING, logger="elastrain.trackers"):
        play_a_run_with_a_crash(handle)
    assert len([r for r in caplog.records if "Tracker failing failed" in r.getMessage()]) == 1
    assert failing.calls[-1] == ("end", ("FINISHED", None))  # later calls still reach it
    assert healthy.calls[-1] == ("end", ("FINISHED", None))


def test_the_environment_names_the_trackers_and_bad_names_say_what_is_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELASTRAIN_TRACKERS", "mlflow, wandbb")
    with pytest.raises(ValueError, match="names wandbb; it takes a comma-separated list of mlflow, tensorboard, wandb"):
        TrackersObserver().start_run(run_record())


def test_a_missing_client_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from elastrain.trackers import WandbTracker

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(ImportError, match=r"pip install 'elastrain-trackers\[wandb\]'"):
        WandbTracker()
