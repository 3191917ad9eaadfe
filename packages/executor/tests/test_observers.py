"""Run observers: none installed changes nothing (and imports no pydantic); a broken one never fails a job."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from elastrain.executor import RayExecutor, context
from elastrain.executor._private import observers

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
