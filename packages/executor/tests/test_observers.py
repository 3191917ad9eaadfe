"""Run observers: none installed changes nothing (and imports no pydantic); a broken one never fails a job."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from elastrain.executor import RayExecutor, WorkerDiedError, WorkerError, context
from elastrain.executor._private import observers
from elastrain.executor._private.metric_reports import metric_report

pytestmark = pytest.mark.usefixtures("ray_4_cpus")


@pytest.fixture
def fake_observers() -> Iterator[list[Any]]:
    saved = observers._factories
    installed: list[Any] = []
    observers._factories = installed
    try:
        yield installed
    finally:
        observers._factories = saved


def test_without_elastrain_state_nothing_observes_and_pydantic_stays_out() -> None:
    settings = RayExecutor.create_settings(timeout_s=60)
    with RayExecutor(settings, num_workers=2, cpus_per_worker=0.5) as executor:
        executor.start()
        assert [c.rank for c in executor.run(context)] == [0, 1]
    assert observers._load_factories() == []  # elastrain-state is not installed in this environment
    assert "pydantic" not in sys.modules


class Recorder:
    events: ClassVar[list[tuple[str, Any]]] = []

    def start_run(self, run: dict[str, Any]) -> Recorder:
        self.events.append(("start", run))
        return self

    def workers_changed(self, workers: list[dict[str, Any]], world_size: int, resets: int) -> None:
        self.events.append(("workers", world_size))

    def finished(self) -> None:
        self.events.append(("finished", None))

    def failed(self, detail: str) -> None:
        self.events.append(("failed", detail))


class Broken:
    def start_run(self, run: dict[str, Any]) -> Broken:
        return self

    def finished(self) -> None:
        raise RuntimeError("observer bug")


def test_observers_see_runs_and_a_broken_one_is_dropped(fake_observers: list[Any]) -> None:
    fake_observers += [Broken, Recorder]
    Recorder.events = []
    settings = RayExecutor.create_settings(timeout_s=60)
    with RayExecutor(settings, num_workers=2, cpus_per_worker=0.5) as executor:
        executor.start()
        assert executor.last_run_id is None
        executor.run(context)
        first_id = executor.last_run_id
        executor.run(context)
    kinds = [kind for kind, _ in Recorder.events]
    assert kinds == ["start", "finished", "start", "finished"]
    run = Recorder.events[0][1]
    assert run["id"] == first_id  # observers record the run by the id the executor shows its caller
    assert Recorder.events[2][1]["id"] == executor.last_run_id != first_id
    assert run["name"] == "context"
    assert [w["world_rank"] for w in run["workers"]] == [0, 1]
    assert {"actor_id", "node_id", "node_ip", "hostname", "pid", "local_rank", "node_rank", "gpu_ids"} <= set(
        run["workers"][0]
    )


def test_tracking_env_turns_observers_off(fake_observers: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    fake_observers.append(Recorder)
    Recorder.events = []
    monkeypatch.setenv("ELASTRAIN_TRACKING", "off")
    settings = RayExecutor.create_settings(timeout_s=60)
    with RayExecutor(settings, num_workers=1, cpus_per_worker=0.5) as executor:
        executor.start()
        executor.run(context)
    assert Recorder.events == []


class MetricsRecorder:
    """An observer that takes metrics and events too."""

    calls: ClassVar[list[tuple[str, Any]]] = []

    def start_run(self, run: dict[str, Any]) -> MetricsRecorder:
        return self

    def workers_changed(self, workers: list[dict[str, Any]], world_size: int, resets: int) -> None:
        self.calls.append(("workers", world_size))

    def metrics(self, points: list[dict[str, Any]]) -> None:
        self.calls.append(("metrics", points))

    def event(self, kind: str, fields: dict[str, Any]) -> None:
        self.calls.append((kind, fields))

    def finished(self) -> None:
        self.calls.append(("finished", None))

    def failed(self, detail: str) -> None:
        self.calls.append(("failed", detail))


def sends_metrics(steps: int) -> None:
    from elastrain.executor import send

    if context().rank != 0:
        return
    for step in range(steps):
        send({"step": step, "loss": 1.0 / (step + 1), "phase": "train", "done": False})
        send({"note": "no numbers here"})  # not metrics
        send({"step": "first", "loss": 0.0})  # a step that is no step: not metrics


def exits_on_rank_0() -> None:
    if context().rank == 0:
        os._exit(1)
    time.sleep(60)


def fails_on_rank_1(_: Any = None) -> None:
    if context().rank == 1:
        raise ValueError("rank 1 has bad data")


def test_an_observer_takes_what_workers_send_as_metrics_without_callbacks(fake_observers: list[Any]) -> None:
    fake_observers += [MetricsRecorder, Recorder]  # the one without metrics() keeps working
    MetricsRecorder.calls, Recorder.events = [], []
    settings = RayExecutor.create_settings(timeout_s=60)
    with RayExecutor(settings, num_workers=2, cpus_per_worker=0.5) as executor:
        executor.start()
        executor.run(sends_metrics, args=[200])
        with pytest.raises(WorkerError, match="bad data"):
            executor.run(fails_on_rank_1)
        if not executor.started:
            executor.start()
        with pytest.raises(WorkerDiedError):
            executor.run(exits_on_rank_0)  # the executor shuts itself down as the call fails
    died = MetricsRecorder.calls[-2:]
    assert [kind for kind, _ in died] == ["worker_exited", "failed"]
    assert (died[0][1]["status"], died[0][1]["worker"]["world_rank"]) == ("CRASHED", 0)
    del MetricsRecorder.calls[-2:]
    points = [point for kind, batch in MetricsRecorder.calls if kind == "metrics" for point in batch]
    assert [point["step"] for point in points] == list(range(200))
    assert points[-1]["values"] == {"loss": 1.0 / 200}  # only its numbers: no text, no bool
    assert all(isinstance(point["time_ms"], int) for point in points)
    kinds = [kind for kind, _ in MetricsRecorder.calls]
    assert set(kinds[: kinds.index("finished")]) == {"metrics"}
    assert kinds.index("finished") == len(kinds) - 3
    # The rank that raised exits CRASHED before the run fails.
    assert kinds[-2:] == ["worker_exited", "failed"]
    exited = MetricsRecorder.calls[-2][1]
    assert (exited["status"], exited["worker"]["world_rank"]) == ("CRASHED", 1)
    assert exited["detail"] == "ValueError: rank 1 has bad data"
    assert [kind for kind, _ in Recorder.events] == ["start", "finished", "start", "failed", "start", "failed"]


@pytest.mark.parametrize(
    ("message", "report"),
    [
        ({"loss": 0.5, "step": 3}, (3, {"loss": 0.5})),
        ({"loss": 1, "lr": 0.1}, (None, {"loss": 1.0, "lr": 0.1})),
        ({"loss": 0.5, "tag": "eval", "ok": True, "sizes": [1, 2]}, (None, {"loss": 0.5})),
        ({"step": None, "x": float("nan")}, (None, {"x": math.nan})),
        ({"step": 2.0, "loss": 0.5}, None),
        ({"step": -1, "loss": 0.5}, None),
        ({"step": True, "loss": 0.5}, None),
        ({"step": 3}, None),
        ({"ok": True, "note": "text"}, None),
        ({"big": 10**400}, None),
    ],
)
def test_which_messages_are_metrics(message: dict[str, Any], report: Any) -> None:
    found = metric_report(message)
    if report is None or found is None:
        assert found == report
    else:
        assert found[0] == report[0]
        assert found[1] == pytest.approx(report[1], nan_ok=True)
