"""The run table: newest first, paging with cursors, filters, retention."""

from __future__ import annotations

import pytest

from elastrain.state import RunStatus, TrainRunInfo
from elastrain.state._private.table import RunTable


def make(index: int, status: RunStatus = RunStatus.FINISHED, job: str = "job-a", name: str = "train") -> TrainRunInfo:
    end = 10_000 + index if status.is_terminal else None
    return TrainRunInfo(
        name=name, id=f"run-{index:04d}", job_id=job, run_status=status, start_time_ms=1_000 + index, end_time_ms=end
    )


def all_pages(table: RunTable, limit: int, **filters: object) -> list[str]:
    seen: list[str] = []
    cursor = None
    while True:
        runs, cursor = table.page(limit=limit, cursor=cursor, **filters)  # type: ignore[arg-type]
        seen += [r.id for r in runs]
        if cursor is None:
            return seen


def test_paging_returns_every_run_once_newest_first() -> None:
    table = RunTable(max_runs=10_000)
    for index in range(250):
        table.put(make(index))
    seen = all_pages(table, limit=50)
    assert seen == [f"run-{index:04d}" for index in reversed(range(250))]
    assert all_pages(table, limit=7) == seen


def test_filters_by_status_job_and_name() -> None:
    table = RunTable(max_runs=10_000)
    for index in range(120):
        status = [RunStatus.RUNNING, RunStatus.FINISHED, RunStatus.ERRORED][index % 3]
        table.put(make(index, status, job=f"job-{index % 4}", name=f"model-{index % 5}"))
    running = all_pages(table, limit=9, status=RunStatus.RUNNING)
    assert len(running) == 40
    assert all(table.get(i).run_status is RunStatus.RUNNING for i in running)
    both = all_pages(table, limit=5, status=RunStatus.ERRORED, job_id="job-2")
    assert both == [r.id for r in table.all() if r.run_status is RunStatus.ERRORED and r.job_id == "job-2"]
    assert len(all_pages(table, limit=50, name="model-3")) == 24
    assert table.page(job_id="nobody")[0] == []


def test_status_changes_move_runs_between_indexes() -> None:
    table = RunTable(max_runs=100)
    table.put(make(1, RunStatus.RUNNING))
    table.put(make(1, RunStatus.FINISHED))
    assert table.page(status=RunStatus.RUNNING)[0] == []
    assert [r.id for r in table.page(status=RunStatus.FINISHED)[0]] == ["run-0001"]
    assert len(table) == 1


def test_retention_drops_oldest_finished_never_running() -> None:
    table = RunTable(max_runs=5)
    table.put(make(0, RunStatus.RUNNING))
    for index in range(1, 9):
        table.put(make(index))
    ids = [r.id for r in table.all()]
    assert len(ids) == 5
    assert "run-0000" in ids  # oldest, but still running
    assert ids[:4] == ["run-0008", "run-0007", "run-0006", "run-0005"]


def test_bad_limit_and_cursor() -> None:
    table = RunTable(max_runs=10)
    with pytest.raises(ValueError, match="limit must be an int from 1 to 1000"):
        table.page(limit=0)
    with pytest.raises(ValueError, match="not one this API returned"):
        table.page(cursor="!!not-a-cursor")
    with pytest.raises(ValueError, match="max_runs must be a positive int"):
        RunTable(max_runs=0)
