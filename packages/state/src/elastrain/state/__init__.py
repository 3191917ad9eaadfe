"""Run state for elastrain: pydantic run schemas, a detached state actor and a run tracker.

```python
from elastrain.state import RunTracker, get_state_actor

tracker = RunTracker("resnet50")
tracker.start(workers)          # RUNNING, with the workers sorted by rank
tracker.report_metrics(step=100, loss=0.21)  # latest metrics, and a point of the run's bounded history
tracker.finish()                # FINISHED (final: a late update never takes it back)
```

With this package installed, ``elastrain-executor`` records every run by itself (``ELASTRAIN_TRACKING=0`` turns
that off).
"""

from elastrain.state._private.actor import STATE_ACTOR_NAME, STATE_ACTOR_NAMESPACE, StateActor
from elastrain.state._private.client import get_or_create_state_actor, get_state_actor
from elastrain.state._private.history_schemas import (
    MAX_DEPARTED,
    MAX_EVENTS,
    MAX_HISTORY_PAGE,
    MAX_HISTORY_POINTS,
    MAX_HISTORY_VALUES,
    DepartedWorker,
    MetricHistory,
    RunEvent,
    RunEventKind,
    RunEvents,
    RunWorkers,
)
from elastrain.state._private.options import DEFAULT_MAX_HISTORIES, DEFAULT_MAX_RUNS, SNAPSHOT_URI_ENV
from elastrain.state._private.schemas import (
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
    WorkerStatus,
)
from elastrain.state._private.table import MAX_PAGE
from elastrain.state._private.tracker import ExecutorObserver, RunTracker
from elastrain.state._version import __version__

__all__ = [
    "RunStatus",
    "WorkerStatus",
    "ActorStatus",
    "TrainWorkerInfo",
    "TrainDatasetInfo",
    "TrainRunInfo",
    "RunMetrics",
    "RunEventKind",
    "RunEvent",
    "DepartedWorker",
    "MetricHistory",
    "RunEvents",
    "RunWorkers",
    "MAX_HISTORY_POINTS",
    "MAX_HISTORY_VALUES",
    "MAX_EVENTS",
    "MAX_DEPARTED",
    "MAX_HISTORY_PAGE",
    "SCHEMA_VERSION",
    "STATUS_DETAIL_MAX_CHARS",
    "ID_MAX_CHARS",
    "NAME_MAX_CHARS",
    "StateActor",
    "STATE_ACTOR_NAME",
    "STATE_ACTOR_NAMESPACE",
    "DEFAULT_MAX_RUNS",
    "DEFAULT_MAX_HISTORIES",
    "MAX_PAGE",
    "SNAPSHOT_URI_ENV",
    "get_state_actor",
    "get_or_create_state_actor",
    "RunTracker",
    "ExecutorObserver",
    "__version__",
]
