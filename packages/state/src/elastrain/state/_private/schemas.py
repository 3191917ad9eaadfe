"""The run schemas: immutable pydantic models whose JSON round trip is exact."""

from __future__ import annotations

import enum
import math
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# 2: workers carry how they ended (WorkerStatus); runs may carry a history (metrics, events, departed workers).
SCHEMA_VERSION = 2
# status_detail keeps at most this many characters: the start and the end of a long trace, which is where the
# exception type and the failing line are.
STATUS_DETAIL_MAX_CHARS = 16_384
_TRUNCATION_MARK = "\n... [{} characters cut] ...\n"
# A run's latest metrics keep at most this many scalars.
MAX_METRICS = 32
# Every other text field is bounded too, so that one bad caller cannot bloat the actor or its snapshots:
# identifiers (run, job, actor, node ids: Ray's are 8 to 56 characters) and names (run, dataset, metric and
# host names, IP addresses, GPU ids). A longer value is rejected, never cut: a cut id would name something else.
ID_MAX_CHARS = 128
NAME_MAX_CHARS = 256
# At most this many GPU ids per worker and datasets per run.
MAX_LIST_ITEMS = 64


class RunStatus(enum.StrEnum):
    INITIALIZING = "INITIALIZING"  # registered; workers starting
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    ERRORED = "ERRORED"
    ABORTED = "ABORTED"  # stopped from outside (driver gone, cancelled)

    @property
    def is_terminal(self) -> bool:
        return self in (RunStatus.FINISHED, RunStatus.ERRORED, RunStatus.ABORTED)

    @property
    def is_final(self) -> bool:
        """FINISHED and ERRORED never change; ABORTED may still become one of them (a late truth wins)."""
        return self in (RunStatus.FINISHED, RunStatus.ERRORED)


class WorkerStatus(enum.StrEnum):
    """How a worker stands in its run. The state actor records every value but DEAD, which the dashboard shows
    for a worker recorded ALIVE in a run still going whose actor Ray reports dead."""

    ALIVE = "ALIVE"  # in the run's current world
    FINISHED = "FINISHED"  # the run finished with it as a member
    CRASHED = "CRASHED"  # it died, its function raised, or it stopped answering and was evicted
    REMOVED = "REMOVED"  # the job let it go while the run went on: its host left, or a new world left it out
    STOPPED = "STOPPED"  # stopped with its run, which errored or was aborted
    DEAD = "DEAD"  # its actor is dead while the run is recorded as going (shown by the dashboard; version 1 records)


# The name schema version 1 gave it (ALIVE and DEAD only).
ActorStatus = WorkerStatus


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)


NonNegative = Annotated[int, Field(ge=0)]
Id = Annotated[str, Field(max_length=ID_MAX_CHARS)]
Name = Annotated[str, Field(max_length=NAME_MAX_CHARS)]


class TrainWorkerInfo(_Frozen):
    actor_id: Id
    world_rank: NonNegative
    local_rank: NonNegative
    node_rank: NonNegative
    node_id: Id
    node_ip: Name
    hostname: Name
    pid: NonNegative
    gpu_ids: tuple[Name, ...] = Field(default=(), max_length=MAX_LIST_ITEMS)
    status: WorkerStatus = WorkerStatus.ALIVE


class TrainDatasetInfo(_Frozen):
    name: Name
    dataset_uuid: Id
    dataset_name: Name | None = None


class RunMetrics(_Frozen):
    """The latest reported step and a few scalars (NaN and infinities are kept as None: JSON has neither)."""

    step: int | None = None
    values: dict[str, float | None] = Field(default_factory=dict)
    time_ms: NonNegative = 0

    @field_validator("values", mode="before")
    @classmethod
    def _finite(cls, values: Any) -> Any:
        if not isinstance(values, dict):
            return values
        if len(values) > MAX_METRICS:
            raise ValueError(f"at most {MAX_METRICS} metrics per update, got {len(values)}")
        for key in values:
            if isinstance(key, str) and len(key) > NAME_MAX_CHARS:
                raise ValueError(f"metric name {key[:40]!r}... has {len(key)} characters; use at most {NAME_MAX_CHARS}")
        return {
            key: (None if isinstance(value, float) and not math.isfinite(value) else value)
            for key, value in values.items()
        }


class TrainRunInfo(_Frozen):
    """One training run. ``id`` is unique per run: not a job id, and never reused when a run is restored."""

    schema_version: int = SCHEMA_VERSION
    name: Name
    id: Id = Field(min_length=1)
    job_id: Id
    controller_actor_id: Id | None = None
    workers: tuple[TrainWorkerInfo, ...] = ()
    datasets: tuple[TrainDatasetInfo, ...] = Field(default=(), max_length=MAX_LIST_ITEMS)
    run_status: RunStatus = RunStatus.INITIALIZING
    status_detail: str | None = None
    start_time_ms: NonNegative
    end_time_ms: NonNegative | None = None
    min_workers: NonNegative | None = None
    max_workers: NonNegative | None = None
    resets: NonNegative = 0
    world_size: NonNegative = 0
    latest_metrics: RunMetrics | None = None

    @field_validator("workers")
    @classmethod
    def _by_rank(cls, workers: tuple[TrainWorkerInfo, ...]) -> tuple[TrainWorkerInfo, ...]:
        return tuple(sorted(workers, key=lambda worker: worker.world_rank))

    @field_validator("status_detail")
    @classmethod
    def _bounded_detail(cls, detail: str | None) -> str | None:
        return None if detail is None else truncate_detail(detail)

    @model_validator(mode="after")
    def _consistent(self) -> TrainRunInfo:
        if self.end_time_ms is not None and self.end_time_ms < self.start_time_ms:
            raise ValueError("end_time_ms is before start_time_ms")
        if self.schema_version > SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {self.schema_version} is newer than this elastrain-state ({SCHEMA_VERSION}); "
                "upgrade elastrain-state"
            )
        return self


def truncate_detail(detail: str, limit: int = STATUS_DETAIL_MAX_CHARS) -> str:
    """Keep the head and the tail of a long text, marking what was cut; the result has at most ``limit`` chars."""
    if len(detail) <= limit:
        return detail
    cut = len(detail) - limit
    while True:  # the mark names how much was cut, and its own length changes that number: settle it
        mark = _TRUNCATION_MARK.format(cut)
        keep = limit - len(mark)
        if len(detail) - keep == cut:
            break
        cut = len(detail) - keep
    head = keep // 2
    return detail[:head] + mark + detail[len(detail) - (keep - head) :]


def migrate(document: dict[str, Any]) -> dict[str, Any]:
    """Bring a stored run to the current schema version.

    1 → 2: version 1 left the workers of an ended run ALIVE; they now read how the run ended them."""
    version = int(document.get("schema_version", 1))
    if version > SCHEMA_VERSION:
        raise ValueError(f"stored schema_version {version} is newer than {SCHEMA_VERSION}: upgrade elastrain-state")
    if version < 2 and isinstance(document.get("workers"), list) and document.get("run_status") in _ENDED:
        document = {**document, "workers": ended_workers(document["workers"], RunStatus(document["run_status"]))}
    return {**document, "schema_version": SCHEMA_VERSION}


_ENDED = {status.value for status in RunStatus if status.is_terminal}
# A worker still in the world when its run ends: FINISHED with a finished run, STOPPED otherwise. A late truth
# (ABORTED, then FINISHED) changes STOPPED into FINISHED; CRASHED and REMOVED never change.
_ENDABLE = {WorkerStatus.ALIVE.value, WorkerStatus.STOPPED.value, WorkerStatus.FINISHED.value, WorkerStatus.DEAD.value}


def ended_workers(workers: list[Any], status: RunStatus) -> list[Any]:
    """The workers (JSON-ready dicts) as a run that ended with ``status`` leaves them."""
    final = (WorkerStatus.FINISHED if status is RunStatus.FINISHED else WorkerStatus.STOPPED).value
    return [
        {**worker, "status": final}
        if isinstance(worker, dict) and worker.get("status", WorkerStatus.ALIVE.value) in _ENDABLE
        else worker
        for worker in workers
    ]
