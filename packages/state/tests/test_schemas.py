"""The run schemas: exact round trips, immutability, bounded details, versioning."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from elastrain.state import (
    ID_MAX_CHARS,
    NAME_MAX_CHARS,
    SCHEMA_VERSION,
    STATUS_DETAIL_MAX_CHARS,
    ActorStatus,
    RunMetrics,
    RunStatus,
    TrainDatasetInfo,
    TrainRunInfo,
    TrainWorkerInfo,
)
from elastrain.state._private.schemas import migrate, truncate_detail


def worker(rank: int, **changes: object) -> TrainWorkerInfo:
    fields: dict[str, object] = {
        "actor_id": f"actor-{rank}", "world_rank": rank, "local_rank": rank % 2, "node_rank": rank // 2,
        "node_id": f"node-{rank // 2}", "node_ip": "10.0.0.1", "hostname": "host", "pid": 1000 + rank,
        "gpu_ids": (str(rank),), **changes,
    }  # fmt: skip
    return TrainWorkerInfo.model_validate(fields)


def run(**changes: object) -> TrainRunInfo:
    fields: dict[str, object] = {
        "name": "resnet", "id": "run-1", "job_id": "01000000", "controller_actor_id": "ctrl",
        "workers": [worker(1), worker(0)], "datasets": [TrainDatasetInfo(name="train", dataset_uuid="u1")],
        "run_status": RunStatus.RUNNING, "start_time_ms": 1_000, "min_workers": 1, "max_workers": 4,
        "resets": 2, "world_size": 2, "latest_metrics": RunMetrics(step=5, values={"loss": 0.25}, time_ms=2_000),
        **changes,
    }  # fmt: skip
    return TrainRunInfo.model_validate(fields)


def test_round_trips_are_exact() -> None:
    original = run()
    assert TrainRunInfo.model_validate_json(original.model_dump_json()) == original
    assert TrainRunInfo.model_validate(original.model_dump()) == original
    assert TrainRunInfo.model_validate(original.model_dump(mode="json")) == original
    assert original.schema_version == SCHEMA_VERSION


@given(
    name=st.text(max_size=40),
    start=st.integers(min_value=0, max_value=2**53),
    duration=st.one_of(st.none(), st.integers(min_value=0, max_value=10**9)),
    status=st.sampled_from(list(RunStatus)),
    ranks=st.lists(st.integers(min_value=0, max_value=64), unique=True, max_size=8),
    metrics=st.dictionaries(
        st.text(min_size=1, max_size=10), st.floats(allow_nan=False, allow_infinity=False), max_size=5
    ),
)
def test_any_run_round_trips(
    name: str, start: int, duration: int | None, status: RunStatus, ranks: list[int], metrics: dict[str, float]
) -> None:
    original = TrainRunInfo(
        name=name, id="r", job_id="j", start_time_ms=start, end_time_ms=None if duration is None else start + duration,
        run_status=status, workers=tuple(worker(rank) for rank in ranks), latest_metrics=RunMetrics(values=metrics),
    )  # fmt: skip
    assert TrainRunInfo.model_validate_json(original.model_dump_json()) == original
    assert [w.world_rank for w in original.workers] == sorted(ranks)


def test_workers_are_sorted_by_rank_and_models_are_frozen() -> None:
    info = run(workers=[worker(3), worker(0), worker(2), worker(1)])
    assert [w.world_rank for w in info.workers] == [0, 1, 2, 3]
    assert info.workers[0].status is ActorStatus.ALIVE
    with pytest.raises(ValidationError):
        info.name = "other"  # type: ignore[misc]
    with pytest.raises(ValidationError, match="extra"):
        TrainWorkerInfo.model_validate({**worker(0).model_dump(), "environment": {"AWS_SECRET": "x"}})


def test_status_detail_is_bounded_keeping_head_and_tail() -> None:
    trace = "Traceback (most recent call last):\n" + "  frame\n" * 10_000 + "ValueError: the real cause"
    info = run(run_status=RunStatus.ERRORED, status_detail=trace, end_time_ms=2_000)
    assert info.status_detail is not None
    assert len(info.status_detail) == STATUS_DETAIL_MAX_CHARS
    assert info.status_detail.startswith("Traceback")
    assert info.status_detail.endswith("ValueError: the real cause")
    assert "characters cut" in info.status_detail
    assert truncate_detail("short") == "short"


def test_non_finite_metrics_become_null() -> None:
    metrics = RunMetrics(step=1, values={"loss": math.nan, "grad": math.inf, "acc": 0.5})
    assert metrics.values == {"loss": None, "grad": None, "acc": 0.5}
    assert RunMetrics.model_validate_json(metrics.model_dump_json()) == metrics


def test_bad_runs_are_rejected() -> None:
    with pytest.raises(ValidationError, match="end_time_ms is before"):
        run(end_time_ms=10)
    with pytest.raises(ValidationError):
        run(id="")
    with pytest.raises(ValidationError):
        worker(-1)
    with pytest.raises(ValidationError, match="newer than"):
        run(schema_version=SCHEMA_VERSION + 1)
    with pytest.raises(ValueError, match="newer than"):
        migrate({"schema_version": SCHEMA_VERSION + 1})


@pytest.mark.parametrize(
    ("build", "limit"),
    [
        (lambda text: run(name=text), NAME_MAX_CHARS),
        (lambda text: run(id=text), ID_MAX_CHARS),
        (lambda text: run(job_id=text), ID_MAX_CHARS),
        (lambda text: run(controller_actor_id=text), ID_MAX_CHARS),
        (lambda text: worker(0, actor_id=text), ID_MAX_CHARS),
        (lambda text: worker(0, node_id=text), ID_MAX_CHARS),
        (lambda text: worker(0, node_ip=text), NAME_MAX_CHARS),
        (lambda text: worker(0, hostname=text), NAME_MAX_CHARS),
        (lambda text: worker(0, gpu_ids=(text,)), NAME_MAX_CHARS),
        (lambda text: TrainDatasetInfo(name=text, dataset_uuid="u"), NAME_MAX_CHARS),
        (lambda text: TrainDatasetInfo(name="d", dataset_uuid=text), ID_MAX_CHARS),
        (lambda text: TrainDatasetInfo(name="d", dataset_uuid="u", dataset_name=text), NAME_MAX_CHARS),
        (lambda text: RunMetrics(values={text: 1.0}), NAME_MAX_CHARS),
    ],
)
def test_every_text_field_is_bounded(build: Any, limit: int) -> None:
    build("x" * limit)  # the limit itself is fine
    with pytest.raises(ValidationError, match=f"at most {limit}"):
        build("x" * (limit + 1))


def test_lists_of_text_are_bounded() -> None:
    with pytest.raises(ValidationError, match="at most 64"):
        worker(0, gpu_ids=tuple(str(n) for n in range(65)))
    with pytest.raises(ValidationError, match="at most 64"):
        run(datasets=[TrainDatasetInfo(name=f"d{n}", dataset_uuid="u") for n in range(65)])


def test_terminal_and_final_statuses() -> None:
    assert RunStatus.FINISHED.is_final
    assert RunStatus.ERRORED.is_final
    assert RunStatus.ABORTED.is_terminal
    assert not RunStatus.ABORTED.is_final
    assert not RunStatus.RUNNING.is_terminal
