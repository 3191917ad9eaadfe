"""MLflow: a run per executor run, its metrics by step, world size and resets as metrics, events as tags.

MLflow has no events, so each one is a tag ``elastrain.event.NNNN`` (in order) and a line of the run's
``elastrain/events.txt`` artifact, written when the run ends. Works with a local file store (``file:`` or a
path) and a tracking server alike; only ``mlflow-skinny`` is needed to log.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from elastrain.trackers._private.extras import require
from elastrain.trackers._private.tracker import Event, Point, RunInfo

TRACKING_URI_ENV = "ELASTRAIN_MLFLOW_TRACKING_URI"  # else MLflow's own MLFLOW_TRACKING_URI, else its default
EXPERIMENT_ENV = "ELASTRAIN_MLFLOW_EXPERIMENT"
DEFAULT_EXPERIMENT = "elastrain"
_MAX_BATCH = 1_000  # MLflow's limit of metrics in one log_batch
_MAX_TAG = 5_000  # characters in a tag's value on every MLflow version


class MLflowTracker:
    """Runs in MLflow, at ``tracking_uri`` (default: ``ELASTRAIN_MLFLOW_TRACKING_URI``, then MLflow's own
    setting) under ``experiment`` (created when missing)."""

    name = "mlflow"

    def __init__(self, tracking_uri: str | None = None, experiment: str | None = None) -> None:
        require("mlflow", "mlflow", "MLflow")
        self.tracking_uri = tracking_uri or os.environ.get(TRACKING_URI_ENV) or None
        self.experiment = experiment or os.environ.get(EXPERIMENT_ENV) or DEFAULT_EXPERIMENT

    def open(self, run: RunInfo) -> MLflowRun:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=self.tracking_uri)
        found = client.get_experiment_by_name(self.experiment)
        experiment_id = found.experiment_id if found is not None else client.create_experiment(self.experiment)
        tags = {"elastrain.run_id": run.id, "elastrain.job_id": str(run.job_id or "")}
        created = client.create_run(experiment_id, run_name=run.name, tags=tags)
        recorder = MLflowRun(client, created.info.run_id)
        recorder.params(run.params)
        return recorder


class MLflowRun:
    def __init__(self, client: Any, run_id: str) -> None:
        self.client, self.run_id = client, run_id
        self._events: list[str] = []

    def params(self, params: Any) -> None:
        from mlflow.entities import Param

        if params:
            self.client.log_batch(self.run_id, params=[Param(str(k), str(v)) for k, v in params.items()])

    def metrics(self, points: Sequence[Point]) -> None:
        from mlflow.entities import Metric

        batch = [
            Metric(name, value, point.time_ms, point.step if point.step is not None else 0)
            for point in points
            for name, value in point.values.items()
        ]
        for start in range(0, len(batch), _MAX_BATCH):
            self.client.log_batch(self.run_id, metrics=batch[start : start + _MAX_BATCH])

    def world_size(self, size: int, resets: int, step: int | None, time_ms: int) -> None:
        from mlflow.entities import Metric

        at = step if step is not None else 0
        self.client.log_batch(
            self.run_id, metrics=[Metric("world_size", size, time_ms, at), Metric("resets", resets, time_ms, at)]
        )

    def event(self, event: Event) -> None:
        line = f"step {event.step if event.step is not None else '-'}: {event.kind}: {event.text}"
        self._events.append(line)
        self.client.set_tag(self.run_id, f"elastrain.event.{len(self._events):04d}", line[:_MAX_TAG])

    def end(self, status: str, detail: str | None) -> None:
        if detail:
            self.client.set_tag(self.run_id, "elastrain.failure", detail[:_MAX_TAG])
        if self._events:
            self.client.log_text(self.run_id, "\n".join(self._events) + "\n", "elastrain/events.txt")
        self.client.set_terminated(self.run_id, "FINISHED" if status == "FINISHED" else "FAILED")
