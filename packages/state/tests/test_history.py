"""A run's history without Ray: metric points bounded and thinned evenly, steps merged, events and departed
workers bounded, documents that round-trip and go on thinning after a load."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from elastrain.state import MAX_DEPARTED, MAX_EVENTS, MAX_HISTORY_POINTS, MAX_HISTORY_VALUES, RunEventKind
from elastrain.state._private.histories import Histories
from elastrain.state._private.history import MetricSeries, RunHistory, events_page, metrics_page
from elastrain.state._private.history_schemas import HistoryDocument, MetricHistory, StoredMetrics
from elastrain.state._private.schemas import MAX_METRICS, migrate


def worker(index: int) -> dict[str, Any]:
    return {
        "actor_id": f"actor-{index}", "world_rank": index, "local_rank": 0, "node_rank": index, "node_id": "n" * 56,
        "node_ip": "10.0.0.1", "hostname": f"host-{index}", "pid": 1000 + index,
    }  # fmt: skip


def test_metric_history_stays_within_its_bound_at_100000_reported_points() -> None:
    series = MetricSeries()
    for step in range(100_000):
        series.report(step, {"loss": 1.0 / (step + 1), "lr": 0.1, "acc": step / 100_000}, time_ms=step)
        assert len(series.steps) <= MAX_HISTORY_POINTS
    assert series.steps_reported == 100_000
    assert series.stride == 128
    # The first step and every 128th after it, evenly over the whole run, and the newest.
    assert series.steps == [*range(0, 100_000, 128), 99_999]
    assert series.values["loss"][-1] == 1.0 / 100_000
    stored = StoredMetrics.model_validate(series.document())  # what snapshots hold validates
    # A chart gets every point in one bounded request.
    page = MetricHistory.model_validate(
        {"run_id": "r", "retained": True, **metrics_page(stored.model_dump(mode="json"), None, None, 1000)}
    )
    assert page.steps == series.steps
    assert page.next_after_step is None
    assert page.names == ["acc", "loss", "lr"]


def test_many_metrics_keep_fewer_points_and_more_than_32_are_left_out() -> None:
    series = MetricSeries()
    for step in range(5_000):
        series.report(step, {f"m{n}": float(n) for n in range(MAX_METRICS + 3)}, time_ms=step)
        assert len(series.steps) * len(series.values) <= MAX_HISTORY_VALUES
    assert len(series.values) == MAX_METRICS
    assert series.left_out == 3 * 5_000
    assert series.steps[0] == 0
    assert series.steps[-1] == 4_999


def test_one_step_reported_by_several_workers_is_one_point_and_a_rollback_replaces_values() -> None:
    series = MetricSeries()
    for step in range(10):
        series.report(step, {"loss": float(step)}, time_ms=step)
        series.report(step, {"grad_norm": 1.0}, time_ms=step)  # another rank, another metric, the same step
    assert series.steps == list(range(10))
    assert series.values["grad_norm"] == [1.0] * 10
    # A reset rolled the job back to step 6: steps 7-9 are reported again, with new values.
    for step in (7, 8, 9, 10):
        series.report(step, {"loss": -float(step)}, time_ms=100 + step)
    assert series.steps == list(range(11))
    assert series.values["loss"][7:] == [-7.0, -8.0, -9.0, -10.0]
    assert series.time_ms[7] == 7  # a point keeps the time of its first report
    assert series.last_step == 10


def test_reports_without_a_step_go_on_from_the_previous_step() -> None:
    series = MetricSeries()
    assert [series.report(None, {"loss": 1.0}, 0) for _ in range(3)] == [0, 1, 2]
    assert series.report(100, {"loss": 1.0}, 0) == 100
    assert series.report(None, {"loss": 1.0}, 0) == 101


def test_thinning_goes_on_the_same_after_a_snapshot_round_trip() -> None:
    whole, resumed = MetricSeries(), MetricSeries()
    for step in range(0, 9_000, 3):
        whole.report(step, {"loss": float(step)}, time_ms=step)
        resumed.report(step, {"loss": float(step)}, time_ms=step)
        if step in (2_997, 6_000):
            history = RunHistory()
            history.metrics = resumed
            resumed = RunHistory.from_json(history.json()).metrics
    assert resumed.document() == whole.document()


def test_events_and_departed_workers_keep_the_newest_and_count_the_rest() -> None:
    history = RunHistory()
    history.metrics.report(42, {"loss": 1.0}, 0)
    for index in range(MAX_EVENTS + 500):
        history.event(RunEventKind.RESET, index, world_size=2, resets=index + 1)
    for index in range(MAX_DEPARTED + 10):
        history.depart(worker(index), "REMOVED", index, "its host left")
    history.depart(worker(MAX_DEPARTED + 9), "CRASHED", 0, None)  # reported again: counted once
    document = HistoryDocument.model_validate(history.document()).model_dump(mode="json")
    assert len(document["events"]) == MAX_EVENTS
    assert document["events"][0]["seq"] == 500
    assert document["events"][0]["step"] == 42
    assert (len(document["departed"]), document["departed_dropped"]) == (MAX_DEPARTED, 10)
    assert document["departed"][-1]["status"] == "REMOVED"
    first = events_page(document, None, 600)
    assert (first["dropped"], len(first["events"]), first["next_after_seq"]) == (500, 600, 1099)
    rest = events_page(document, first["next_after_seq"], 600)
    assert (len(rest["events"]), rest["next_after_seq"]) == (400, None)
    assert rest["events"][-1]["seq"] == MAX_EVENTS + 499


def test_a_history_loaded_late_takes_what_was_recorded_since() -> None:
    loaded, since = RunHistory(), RunHistory()
    for step in range(5):
        loaded.metrics.report(step, {"loss": 1.0}, step)
    loaded.event(RunEventKind.WORLD_SIZE, 0, world_size=2, resets=0)
    since.metrics.report(7, {"loss": 0.5}, 7)
    since.event(RunEventKind.RESET, 7, world_size=1, resets=1)
    since.depart(worker(1), "CRASHED", 7, "killed")
    loaded.absorb(since)
    assert loaded.metrics.steps == [0, 1, 2, 3, 4, 7]
    assert [(e["seq"], e["kind"]) for e in loaded.events] == [(0, "WORLD_SIZE"), (1, "RESET")]
    assert [w["actor_id"] for w in loaded.departed] == ["actor-1"]


def test_only_the_newest_ended_runs_keep_a_history() -> None:
    histories = Histories(max_histories=3)
    histories.open("running", 0)
    for start in (1, 2):
        histories.open(f"ended-{start}", start)
        histories.end(f"ended-{start}")
    _, dropped = histories.open("new", 10)
    assert dropped == ["ended-1"]  # the oldest ended one goes; the one still running, older still, stays
    assert ["running" in histories, "ended-1" in histories, "ended-2" in histories] == [True, False, True]
    histories.end("new")
    histories.end("running")
    assert histories.open("newer", 11)[1] == ["running"]
    assert histories.document("ended-2") is not None


@pytest.mark.parametrize(
    "metrics",
    [
        {"steps": [1, 2], "time_ms": [0], "values": {}},
        {"steps": [2, 1], "time_ms": [0, 0], "values": {}},
        {"steps": list(range(MAX_HISTORY_POINTS + 1)), "time_ms": [0] * (MAX_HISTORY_POINTS + 1), "values": {}},
        {"steps": [-1], "time_ms": [0], "values": {}},
    ],
    ids=["misaligned", "unordered", "too-many", "negative-step"],
)
def test_a_stored_history_that_breaks_its_bounds_is_refused(metrics: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        HistoryDocument.model_validate({"metrics": metrics})


def test_version_1_runs_read_how_their_run_ended_them() -> None:
    def ended(status: str, worker_status: str) -> str:
        document = {"schema_version": 1, "run_status": status, "workers": [{**worker(0), "status": worker_status}]}
        return str(migrate(document)["workers"][0]["status"])

    assert ended("FINISHED", "ALIVE") == "FINISHED"
    assert ended("ERRORED", "ALIVE") == "STOPPED"
    assert ended("ABORTED", "DEAD") == "STOPPED"
    assert ended("RUNNING", "ALIVE") == "ALIVE"
