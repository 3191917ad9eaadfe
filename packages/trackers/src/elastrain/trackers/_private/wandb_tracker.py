"""Weights & Biases: a run per executor run, metrics against the job's own step, events in a table.

W&B's own step only grows, and an elastic job steps back after a reset (it goes on from its last commit), so
every value is logged against a ``trainer/step`` metric instead. Offline mode (``WANDB_MODE=offline``) needs no
network; ``wandb sync`` uploads later.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from elastrain.trackers._private.extras import require
from elastrain.trackers._private.tracker import Event, Point, RunInfo

PROJECT_ENV = "ELASTRAIN_WANDB_PROJECT"  # else W&B's own WANDB_PROJECT, else "elastrain"
DEFAULT_PROJECT = "elastrain"
STEP_METRIC = "trainer/step"


class WandbTracker:
    """Runs in W&B under ``project``; ``mode`` ("online", "offline") and ``dir`` as ``wandb.init`` takes them
    (default: W&B's own settings, such as ``WANDB_MODE`` and ``WANDB_DIR``)."""

    name = "wandb"

    def __init__(self, project: str | None = None, mode: str | None = None, dir: str | None = None) -> None:
        require("wandb", "wandb", "W&B")
        self.project = project or os.environ.get(PROJECT_ENV) or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
        self.mode, self.dir = mode, dir

    def open(self, run: RunInfo) -> WandbRun:
        import wandb

        handle = wandb.init(
            project=self.project,
            name=run.name,
            config=dict(run.params),
            tags=["elastrain"],
            mode=self.mode,
            dir=self.dir,
            reinit="create_new",
            notes=f"elastrain run {run.id}",
        )
        handle.define_metric(STEP_METRIC)
        handle.define_metric("*", step_metric=STEP_METRIC)
        return WandbRun(handle)


class WandbRun:
    def __init__(self, run: Any) -> None:
        self.run = run
        self._events: list[list[Any]] = []

    def metrics(self, points: Sequence[Point]) -> None:
        for point in points:
            self.run.log({STEP_METRIC: point.step if point.step is not None else 0, **point.values})

    def world_size(self, size: int, resets: int, step: int | None, time_ms: int) -> None:
        self.run.log({STEP_METRIC: step if step is not None else 0, "world_size": size, "resets": resets})

    def event(self, event: Event) -> None:
        self._events.append([event.step, event.kind, event.text, event.time_ms])
        self.run.summary["elastrain/last_event"] = event.text

    def end(self, status: str, detail: str | None) -> None:
        import wandb

        if self._events:
            self.run.log({"elastrain/events": wandb.Table(["step", "kind", "text", "time_ms"], self._events)})
        self.run.summary["elastrain/status"] = status + (f": {detail}" if detail else "")
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)
